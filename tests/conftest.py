import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICE_KINDS = ("env", "sandbox", "rollout", "router", "trainer")


@pytest.fixture
def subprocess_env():
    """The environment for child processes: this interpreter's package on the path, quiet logs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("ATGRPO_LOG_LEVEL", "WARNING")
    return env


@pytest.fixture
def python():
    return sys.executable

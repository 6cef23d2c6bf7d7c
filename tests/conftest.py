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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The tiny offline model's directory (atgrpo.models.build_tiny_model), built once for the
    session: the build is byte-identical every time. Read it, never write into it; a test that
    changes a model copies it first (tests/e2e/taught.py)."""
    from atgrpo.models import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))

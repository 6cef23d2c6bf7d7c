"""The router starts without torch: a local start runs the router, the trainer and the rollout at
once on two cores, and the router's import of torch (a second of CPU) made the other two wait on
it. Its first step imports torch (the advantages) while the rollout collects."""

import subprocess
import sys

from tests.conftest import ROOT


def test_the_router_service_imports_and_builds_without_torch(subprocess_env):
    code = (
        "import sys\n"
        "import router_svc.__main__\n"
        "from router_svc.server import bindings\n"
        "bindings()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch" not in done.stdout.strip(), done.stdout

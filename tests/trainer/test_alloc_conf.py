"""The trainer service sets CUDA's allocator to expandable segments before torch loads (the
allocator reads it once, at its start), and leaves an operator's own setting alone."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

# Records what the variable holds at the moment torch is first imported.
SPY = """
import os, sys
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("torch sees", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
            sys.meta_path.remove(self)
        return None
sys.meta_path.insert(0, Spy())
import trainer_svc.__main__
"""


@pytest.mark.parametrize(
    "given, seen",
    [(None, "expandable_segments:True"), ("max_split_size_mb:128", "max_split_size_mb:128")],
)
def test_the_trainer_sets_expandable_segments_before_torch_loads(subprocess_env, given, seen):
    env = {k: v for k, v in subprocess_env.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if given:
        env["PYTORCH_CUDA_ALLOC_CONF"] = given
    done = subprocess.run(
        [sys.executable, "-c", SPY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == f"torch sees {seen}"

"""Data parallelism within a pool: two gloo ranks under torchrun give the single-process update."""

import os
import socket
import subprocess
import sys

import torch

from tests.conftest import ROOT
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.update import UpdateConfig, update


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_equal_one_process(tmp_path):
    from atgrpo.models import build_tiny_model

    model_dir = str(build_tiny_model(tmp_path / "tiny"))
    out = tmp_path / "dist.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                          str(ROOT / "tests" / "trainer" / "dist_worker.py"), model_dir, str(out)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    two = torch.load(out, weights_only=False)

    model = load(model_dir)
    samples = on_policy_samples(model)
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = update(model, torch.optim.SGD(params, lr=1e-3), samples, UpdateConfig(mini_batch_size=8),
                     params=params, generator=torch.Generator().manual_seed(1))
    one = model.state_dict()
    for k in one:
        assert torch.allclose(one[k], two["state"][k], atol=1e-8, rtol=1e-5), k
    assert abs(metrics["loss"] - two["metrics"]["loss"]) < 1e-6

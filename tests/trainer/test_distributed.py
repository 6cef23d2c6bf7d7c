"""A pool over two gloo ranks under torchrun gives the single-process update: replicated (ddp,
gradients all-reduced) and sharded (FSDP2, gradients reduce-scattered, full weights gathered),
both through the chunked (fused) output layer."""

import os
import socket
import subprocess
import sys

import pytest
import torch

from atgrpo.contract.trainer import MISMATCH_KEYS, UpdateConfig
from tests.conftest import ROOT
from tests.trainer.dist_worker import NO_CLIP
from tests.trainer.test_update import load, on_policy_samples
from tests.trainer.test_update_async import mixed_staleness
from trainer_svc.update import DECOUPLED_KEYS, update
from trainer_svc.update_context import TrainerUpdateSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_args(nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
    ]


def torchrun_env() -> dict[str, str]:
    # One thread per rank: two ranks share the CI machine's two cores.
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def update_mismatches(before, one, two, rel=1e-3) -> list[str]:
    """The parameters whose two updates (changes from `before`) disagree by more than `rel` of the
    change's size, beyond float32's rounding of the parameters themselves: a mutant that averages
    instead of summing the ranks' gradients, or drops a rank's share, is off by half the change."""
    out = []
    for k in one:
        d1, d2 = one[k] - before[k], two[k] - before[k]
        rounding = 4 * torch.finfo(torch.float32).eps * float(before[k].abs().max())
        if float((d1 - d2).abs().max()) > rel * float(d1.abs().max()) + rounding:
            out.append(k)
    return out


# fsdp: mini-batches of 5 and 3 rows, one row per micro-batch, so rank 0 runs one micro-batch
# more than rank 1 in each: the padding that keeps FSDP's collectives in step is exercised.
# ckpt: FSDP with gradient checkpointing (each layer's recompute all-gathers it again).
# stale: max_staleness 1 on 7 samples of mixed staleness: the proximal pass splits them over the
# ranks (4 and 3 forwards, padded to 4 under FSDP) and sums the shares.
@pytest.mark.parametrize(
    "sharding, mini_batch, micro_tokens, flag",
    [("ddp", 8, 8192, ""), ("fsdp", 5, 12, ""), ("fsdp", 5, 12, "ckpt"), ("fsdp", 5, 12, "stale")],
)
def test_two_gloo_ranks_equal_one_process(
    tiny_model, tmp_path, sharding, mini_batch, micro_tokens, flag
):
    out = tmp_path / "dist.pt"
    worker = str(ROOT / "tests" / "trainer" / "dist_worker.py")
    run = subprocess.run(
        [
            *torchrun_args(),
            worker,
            tiny_model,
            str(out),
            sharding,
            str(mini_batch),
            str(micro_tokens),
            *([flag] if flag else []),
        ],
        env=torchrun_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    two = torch.load(out, weights_only=False)
    # the chunked head, FSDP included (its root's parameters gathered as a forward of the root):
    # no (B, T, V) logits
    assert two["chunked"]

    model = load(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    samples = (
        mixed_staleness(on_policy_samples(model)) if flag == "stale" else on_policy_samples(model)
    )
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = update(
        model,
        torch.optim.SGD(params, lr=0.1),
        samples,
        UpdateConfig(mini_batch_size=mini_batch, max_staleness=int(flag == "stale")),
        params=params,
        settings=TrainerUpdateSettings(micro_batch_tokens=micro_tokens, grad_clip=NO_CLIP),
        generator=torch.Generator().manual_seed(1),
    )
    assert metrics["optimizer_steps"] == (1 if mini_batch == 8 else 2)
    assert set(two["state"]) == set(before)
    assert update_mismatches(before, model.state_dict(), two["state"]) == []
    # every update here scores the trainer's own log-probs (behav_imp_cap 2): the one-step ddp
    # one from its training forwards, the others from the pass and the first step's forwards,
    # gathered over the ranks
    for k in ("loss", "grad_norm", "entropy", *DECOUPLED_KEYS, *MISMATCH_KEYS):
        assert two["metrics"][k] == pytest.approx(metrics[k], rel=1e-5, abs=1e-7), k


def test_fsdp_mixed_precision_trains_as_autocast_does(tiny_model, tmp_path):
    """FSDP's own bf16 policy (gathered in bf16, reduced in float32; no autocast cast cache)
    against one process under bf16 autocast: bf16 rounding apart, the same loss and update."""
    out = tmp_path / "dist.pt"
    worker = str(ROOT / "tests" / "trainer" / "dist_worker.py")
    run = subprocess.run(
        [*torchrun_args(), worker, tiny_model, str(out), "fsdp", "8", "8192", "bf16"],
        env=torchrun_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    two = torch.load(out, weights_only=False)
    assert two["chunked"]
    model = load(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = update(
        model,
        torch.optim.SGD(params, lr=0.1),
        on_policy_samples(model),
        UpdateConfig(mini_batch_size=8),
        params=params,
        settings=TrainerUpdateSettings(
            micro_batch_tokens=8192, grad_clip=NO_CLIP, autocast_bf16=True
        ),
        generator=torch.Generator().manual_seed(1),
    )
    assert two["metrics"]["loss"] == pytest.approx(metrics["loss"], rel=0.05, abs=1e-3)
    assert two["metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=0.05)
    one = model.state_dict()
    d1 = torch.cat([(one[k] - before[k]).flatten() for k in one if "rotary" not in k])
    d2 = torch.cat([(two["state"][k] - before[k]).flatten() for k in one if "rotary" not in k])
    assert torch.nn.functional.cosine_similarity(d1, d2, dim=0) > 0.98
    # float32 masters
    assert all(v.dtype == torch.float32 for v in two["state"].values() if v.is_floating_point())

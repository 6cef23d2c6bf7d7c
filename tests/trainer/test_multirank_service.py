"""The trainer service over two gloo ranks under torchrun (FSDP): rank 0 answers Setup, Train and
SaveCheckpoint over gRPC, the other rank trains with it, the checkpoint holds the same weights as
a one-process trainer's on the same samples, each rank writes its own shards of it, it resumes
in one process and in the pool, and SIGTERM to rank 0 stops every rank with status 0."""

import asyncio
import json
import os
import signal
import subprocess
import time

import pytest
import torch

from atgrpo.contract.trainer import UpdateConfig
from tests.conftest import ROOT
from tests.trainer.test_distributed import torchrun_args, torchrun_env
from tests.trainer.test_trainer_service import pool_spec
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.client import TrainerClient
from trainer_svc.state import SHARDED_STATE, TRAINER_STATE, read_trainer_state
from trainer_svc.trainer import Trainer

UPDATE = UpdateConfig(mini_batch_size=4)  # two optimizer steps on 8 samples
# AdamW moves a weight by about lr = 1e-3 per step whatever its gradient's size; where a
# gradient is near Adam's eps, float summation order (two ranks' halves vs one sum) shows up as
# a few 1e-6 (measured: 5.5e-6 at most). A rank's samples missing or counted twice moves weights
# by ~1e-3.
ADAM_ATOL = 2e-5


def start_trainer(launch: list[str], port_file) -> subprocess.Popen:
    """`launch` (a torchrun command line) running the trainer service with FSDP; rank 0 writes
    its port to `port_file`. Its own process group, for a kill of every rank."""
    args = ["-m", "trainer_svc", "--port", "0", "--port-file", str(port_file), "--sharding", "fsdp"]
    return subprocess.Popen(
        [*launch, *args, "--grace-s", "1"],
        env=torchrun_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_port_file(proc: subprocess.Popen, path, timeout_s: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"torchrun exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("the trainer did not report its port")
        time.sleep(0.2)
    return json.loads(path.read_text())


def one_process(model_dir, steps, resume_from=""):
    """The reference: an in-process trainer, no torch.distributed, the same calls. Returns each
    step's result and the parameters after it."""

    async def go():
        trainer = Trainer()
        await trainer.setup(pool_spec(model_dir), resume_from=resume_from)
        out = []
        for s in steps:
            v = trainer.state.version
            result = await trainer.train("run1", v + 1, v, s, UPDATE)
            out.append(
                (result, {k: t.clone() for k, t in trainer.state.model.state_dict().items()})
            )
        return out

    return asyncio.run(go())


def test_two_rank_fsdp_service_trains_like_one_process(tiny_model, tmp_path):
    samples = on_policy_samples(load(tiny_model), seed=1)
    port_file = tmp_path / "port.json"
    proc = start_trainer(torchrun_args(), port_file)
    try:
        served = wait_for_port_file(proc, port_file)

        async def drive():
            async with TrainerClient(f"127.0.0.1:{served['port']}") as t:
                # Deadlines: a rank that failed to follow would leave rank 0 waiting in a
                # collective.
                info = await t.setup(pool_spec(tiny_model), timeout_s=60)
                assert info.service.details["ranks"] == "2" and info.version == 0
                resp = await t.train("run1", 1, 0, samples, update=UPDATE, timeout_s=60)
                saved = await t.save_checkpoint(str(tmp_path / "ckpt"), timeout_s=60)
                # Rolled back onto its own checkpoint (each rank reads its shards), it goes on.
                await t.setup(
                    pool_spec(tiny_model), resume_from=saved.path, reload=True, timeout_s=60
                )
                await t.train("run1", 2, 1, more, update=UPDATE, timeout_s=60)
                again = await t.save_checkpoint(str(tmp_path / "ckpt2"), timeout_s=60)
                return resp, saved, again

        more = on_policy_samples(load(tiny_model), seed=2)
        resp, saved, again = asyncio.run(drive())
        os.kill(served["pid"], signal.SIGTERM)  # rank 0: it stops serving, then stops rank 1
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-3000:]
        assert "rank 1: stopped" in out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    from transformers import AutoModelForCausalLM

    (ref, one), (_, uninterrupted) = one_process(tiny_model, [samples, more])
    assert (resp.version, saved.version) == (1, 1)
    assert resp.metrics["loss"] == pytest.approx(ref.metrics["loss"], abs=1e-6)
    assert resp.metrics["grad_norm"] > 1.0  # so the sharded gradient clipping was at work
    assert resp.metrics["grad_norm"] == pytest.approx(ref.metrics["grad_norm"], rel=1e-5)
    two = AutoModelForCausalLM.from_pretrained(f"{saved.path}/model").state_dict()
    before = load(tiny_model).state_dict()
    for k in one:
        assert not torch.equal(one[k], before[k]) or "rotary" in k, k
        assert torch.allclose(two[k], one[k], rtol=0, atol=ADAM_ATOL), k
    # Each rank wrote its own shards of the masters and moments; nothing of them went through
    # rank 0's memory into trainer_state.pt.
    assert sorted(p.name for p in (tmp_path / "ckpt" / SHARDED_STATE).glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not {"optimizer", "master"} & set(read_trainer_state(tmp_path / "ckpt" / TRAINER_STATE))
    # The sharded pool's checkpoint resumes in one process, and in the pool itself: either way the
    # next update equals the uninterrupted one-process trainer's.
    [(resumed, after)] = one_process(tiny_model, [more], resume_from=saved.path)
    assert resumed.version == 2 and again.version == 2
    rolled_back = AutoModelForCausalLM.from_pretrained(f"{again.path}/model").state_dict()
    for k in after:
        assert torch.allclose(after[k], uninterrupted[k], rtol=0, atol=ADAM_ATOL), k
        assert torch.allclose(rolled_back[k], uninterrupted[k], rtol=0, atol=ADAM_ATOL), k

"""A trainer pool whose one rank fails, alone, in the middle of a run: the other rank ends itself
within seconds (never waiting out a collective), and the pool, started again as its launcher
would, resumes from its checkpoint.

The pool runs as two "nodes" (two torchrun launchers of one rank each, gloo, as in
test_multinode.py), so no torchrun tears the survivor down: it must leave on its own. The fault is
rank 1's alone, in its second update, after a checkpoint of version 1: an exception raised outside
any collective (rank 0 is then inside one), a SIGKILL while rank 1 is stalled, or a stall with no
kill (a hung rank: the collective timeout ends rank 0). The test then acts as the launcher (the
LeaderWorkerSet recreating the group): it starts both nodes again, and the router's recovery, a
Setup from the checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from atgrpo.errors import AtgrpoError, InvalidArgument
from tests.conftest import ROOT
from tests.trainer.test_distributed import free_port, torchrun_env
from tests.trainer.test_multirank_service import UPDATE
from tests.trainer.test_trainer_service import pool_spec
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.client import TrainerClient
from trainer_svc.distributed import FAILED_EXIT, FAULT_ENV

# rank 0's exit after the fault, at most (seen: raise 2.1 s, kill 0.1-0.2 s, stall 7.1 s)
SURVIVOR_EXIT_S = 20.0


class Pool:
    """Two node launchers of one rank each, logging to files; `fault`: FAULT_ENV's value."""

    def __init__(self, tmp_path, name: str, timeout_s: float, fault: str = ""):
        port, self.port_file = free_port(), tmp_path / f"{name}.port.json"
        self.logs = [tmp_path / f"{name}.node{r}.log" for r in (0, 1)]
        env = {**torchrun_env(), **({FAULT_ENV: fault} if fault else {})}
        launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2"]
        launch += ["--master-addr=127.0.0.1", f"--master-port={port}", "--nproc-per-node=1"]
        serve = ["-m", "trainer_svc", "--port", "0", "--port-file", str(self.port_file)]
        serve += ["--sharding", "fsdp", "--grace-s", "1", "--collective-timeout-s", str(timeout_s)]
        self.nodes = [
            subprocess.Popen(
                [*launch[:3], f"--node-rank={r}", *launch[3:], *serve],
                env=env,
                cwd=ROOT,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, for a kill of every rank
            )
            for r, log in enumerate(self.logs)
        ]

    def served(self, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            assert all(n.poll() is None for n in self.nodes), self.output()
            assert time.monotonic() < deadline, "the trainer did not report its port"
            time.sleep(0.2)
        return json.loads(self.port_file.read_text())

    def output(self, node: int | None = None) -> str:
        logs = self.logs if node is None else [self.logs[node]]
        return "\n".join(log.read_text() for log in logs)

    def rank_1(self) -> psutil.Process:
        [worker] = psutil.Process(self.nodes[1].pid).children()
        return worker

    def wait_for(self, node: int, text: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.logs[node].read_text():
            assert time.monotonic() < deadline, f"no {text!r} in node {node}'s log"
            time.sleep(0.05)

    def kill(self) -> None:
        """Every rank, then its launcher: torchrun starts its ranks in sessions of their own, so
        killing the launcher's process group alone leaves a hung rank running."""
        for n in self.nodes:
            if n.poll() is None:
                for worker in psutil.Process(n.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        worker.kill()
                os.killpg(n.pid, signal.SIGKILL)
                n.wait()


def fail_rank_1(tiny_model, tmp_path, how: str, timeout_s: float) -> tuple[float, str]:
    """A checkpoint of version 1, then rank 1's fault (`how`) in the second update. Returns the
    seconds from the fault to rank 0's exit, and the checkpoint's folder."""
    action = "raise" if how == "raise" else "stall"
    pool = Pool(tmp_path, how, timeout_s, fault=f"1:train:2:{action}")
    try:
        served = pool.served()
        rank_0 = psutil.Process(served["pid"])

        async def drive() -> tuple[float, str]:
            async with TrainerClient(f"127.0.0.1:{served['port']}") as t:
                await t.setup(pool_spec(tiny_model), timeout_s=60)
                await t.train("run1", 1, 0, on_policy_samples(load(tiny_model), seed=1),
                              update=UPDATE, timeout_s=60)  # fmt: skip
                saved = await t.save_checkpoint(str(tmp_path / "ckpt"), timeout_s=60)
                assert saved.version == 1
                more = on_policy_samples(load(tiny_model), seed=2)
                train = asyncio.create_task(t.train("run1", 2, 1, more, update=UPDATE, timeout_s=5))
                # rank 1's fault comes as it starts the update: by the time its log says so, rank
                # 0 is gathering the first layer (FSDP) and waits for it
                await asyncio.to_thread(pool.wait_for, 1, "injected fault")
                fault = time.monotonic()
                if how == "kill":
                    pool.rank_1().kill()
                await asyncio.to_thread(rank_0.wait, 60)
                elapsed = time.monotonic() - fault
                with pytest.raises(AtgrpoError):  # rank 0 left without answering
                    await train
                return elapsed, saved.path

        elapsed, ckpt = asyncio.run(drive())
        codes = [pool.nodes[0].wait(30)]
        if how == "stall":  # the hung rank stays hung: the launcher's restart ends it
            pool.kill()
        codes.append(pool.nodes[1].wait(30))
    finally:
        pool.kill()
    assert codes[0] == FAILED_EXIT and codes[1] != 0, (codes, pool.output())
    out = pool.output(0)
    assert "rank 0: pool operation 'train' failed" in out, out[-3000:]
    if how == "raise":  # rank 1 says why
        assert "RuntimeError: injected fault in train on rank 1" in pool.output(1)
    return elapsed, ckpt


def resume(tiny_model, tmp_path, ckpt: str) -> None:
    """The launcher's restart and the router's recovery: the pool is back at the checkpoint's
    version, and trains on from it."""
    pool = Pool(tmp_path, "restarted", 60.0)
    try:
        served = pool.served()

        async def drive():
            async with TrainerClient(f"127.0.0.1:{served['port']}") as t:
                # A refusal every rank makes together (no model in that folder) is answered, and
                # the pool serves on: only a failure ends it.
                with pytest.raises(InvalidArgument, match="cannot load the pool's model"):
                    await t.setup(pool_spec(str(tmp_path)), timeout_s=60)
                info = await t.setup(pool_spec(tiny_model), resume_from=ckpt, timeout_s=60)
                more = on_policy_samples(load(tiny_model), seed=2)
                result = await t.train("run1", 2, 1, more, update=UPDATE, timeout_s=60)
                return info.version, result.version

        assert asyncio.run(drive()) == (1, 2)  # the checkpoint's version, then one more update
        os.kill(served["pid"], signal.SIGTERM)
        assert [n.wait(60) for n in pool.nodes] == [0, 0], pool.output()
    finally:
        pool.kill()


# raise: an exception on rank 1 alone, outside any collective (a long timeout: it is not what
# ends rank 0). kill: SIGKILL of rank 1 mid-update. stall: rank 1 hangs; the timeout ends rank 0.
@pytest.mark.parametrize("how, timeout_s", [("raise", 120.0), ("kill", 120.0), ("stall", 5.0)])
def test_one_rank_failing_ends_the_other_and_the_pool_resumes(tiny_model, tmp_path, how, timeout_s):
    elapsed, ckpt = fail_rank_1(tiny_model, tmp_path, how, timeout_s)
    print(f"{how}: rank 0 exited {elapsed:.2f}s after rank 1's fault")
    assert elapsed < SURVIVOR_EXIT_S
    if how == "stall":  # the timeout ended it, not before
        assert elapsed > timeout_s * 0.8
    resume(tiny_model, tmp_path, ckpt)

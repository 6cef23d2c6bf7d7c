"""Each rank of a multi-GPU pool works on its own GPU on every thread that touches the model.

CUDA's current device is per thread and FSDP2 and NCCL take theirs from it, so a rank that set
its device only in its main thread ran its pool operations (on another thread) on cuda:0. There is
no GPU here: CUDA is replaced by a recorder of set_device calls (a fake that pins the rule), and the
test checks that the thread each operation runs on set LOCAL_RANK's device first."""

import asyncio
import threading

import pytest
import torch

from trainer_svc import distributed
from trainer_svc.trainer import Trainer


@pytest.fixture
def cuda_calls(monkeypatch):
    """A pretend CUDA: (thread, device index) of every set_device call; this process is rank 1."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda i: calls.append((threading.get_ident(), i))
    )
    monkeypatch.setenv("LOCAL_RANK", "1")
    return calls


class ScriptedRanks:
    """A fake of Ranks that hands the follower a fixed list of operations, then stop."""

    rank, world_size, fault = 1, 2, None

    def __init__(self, ops: list[str]):
        self.ops = [*ops, distributed.STOP]
        self.left = False

    def agree(self, outcome: int) -> tuple[int, int]:
        return outcome, outcome  # the other rank did as this one

    def receive(self):
        return self.ops.pop(0), ()

    def leave(self):
        self.left = True


def test_the_followers_operations_run_on_a_thread_bound_to_its_rank_s_gpu(cuda_calls):
    ran: list[int] = []

    class Ops:
        def setup(self):
            ran.append(threading.get_ident())

        train = setup

    ranks = ScriptedRanks(["setup", "train"])
    # as run_follower does
    follower = threading.Thread(target=distributed.follow, args=(ranks, Ops()))
    follower.start()
    follower.join(10)
    assert ranks.left and len(ran) == 2 and set(ran) == {follower.ident}
    assert (follower.ident, 1) in cuda_calls, (
        f"the follower's thread never set cuda:1: {cuda_calls}"
    )


def test_rank_zero_s_pool_operations_run_on_a_thread_bound_to_its_gpu(cuda_calls):
    trainer = Trainer("pool")
    trainer.ops.release = threading.get_ident  # the op reports the thread it ran on
    ident = asyncio.run(trainer._run("release"))
    assert ident != threading.get_ident()
    assert (ident, 1) in cuda_calls, f"the pool-ops thread never set cuda:1: {cuda_calls}"

"""One trainer service over several ranks: `torchrun --nproc-per-node N -m trainer_svc ...`.

Rank 0 serves gRPC exactly as a one-process trainer does, and answers every call. The other
ranks serve nothing: they wait for rank 0 to send them each pool operation it runs (PoolOps in
trainer.py: setup, train, weights, save) with its arguments, and run it with rank 0, so FSDP's
collectives line up. Operations travel over a separate gloo group with a long timeout (a pool
may sit idle between steps far longer than the training group's collective timeout), pickled
by `broadcast_object_list`; the training collectives use the default group (gloo on CPU, NCCL
on GPUs). Ranks must see the same files: checkpoints are read by every rank on resume (one node,
or a shared volume).

Shutdown: on SIGTERM rank 0 stops serving, then sends "stop"; the others leave their loop and
all ranks exit 0. torchrun signals every rank at once: a follower then waits (bounded) for rank
0's "stop" instead of dying in the middle of a collective.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

STOP = "stop"
IDLE_TIMEOUT = timedelta(days=365)  # followers wait this long for rank 0's next operation


@dataclass
class Ranks:
    """This process's place in the pool and the channel rank 0 sends operations on."""

    rank: int
    world_size: int
    control: dist.ProcessGroup

    def send(self, op: str, args: tuple) -> None:
        """Rank 0: hand an operation to every other rank (returns once it is sent)."""
        dist.broadcast_object_list([op, args], src=0, group=self.control)

    def leave(self) -> None:
        """Every rank, at stop: wait until all have the stop. A rank tearing its gloo pairs down
        while another still uses them aborted that one ("terminate called without an active
        exception")."""
        dist.barrier(group=self.control)

    def receive(self) -> tuple[str, tuple]:
        """Other ranks: block until rank 0 sends the next operation."""
        message = [None, None]
        dist.broadcast_object_list(message, src=0, group=self.control)
        return message[0], message[1]


def bind_device() -> None:
    """Make this rank's GPU (LOCAL_RANK) the calling thread's current CUDA device.

    CUDA's current device is per thread, and FSDP2 (its device mesh, its streams) and NCCL take
    theirs from it: a rank whose pool operations run on a thread that never set it runs them on
    cuda:0, beside rank 0. So every thread that works on the model calls this first: the main
    thread, the follower's loop and rank 0's pool-ops thread. Nothing to do without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def init_from_env() -> Ranks | None:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, MASTER_ADDR ...); None when
    this process is the whole pool."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    bind_device()
    if torch.cuda.is_available():
        dist.init_process_group("cpu:gloo,cuda:nccl")  # gloo for CPU tensors, NCCL for GPU ones
    else:
        dist.init_process_group("gloo")
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return Ranks(dist.get_rank(), dist.get_world_size(), control)


def follow(ranks: Ranks, ops) -> None:
    """Run each operation rank 0 sends on `ops` (a PoolOps) until it sends stop."""
    bind_device()  # this is the thread the operations run on (run_follower starts it)
    while True:
        op, args = ranks.receive()
        if op == STOP:
            ranks.leave()
            return
        try:
            getattr(ops, op)(*args)
        except Exception:  # rank 0 ran the same op on the same input and answered the error
            log.exception("rank %d: %s failed", ranks.rank, op)


def run_follower(ranks: Ranks, ops, grace_s: float) -> int:
    """A non-zero rank's main: follow in a thread, so that SIGTERM can be handled while the
    thread blocks in a collective. Returns the exit status."""
    done = threading.Event()
    failed: list[BaseException] = []

    def loop() -> None:
        try:
            follow(ranks, ops)
        except BaseException as err:  # rank 0 is gone: the group is broken
            failed.append(err)
        finally:
            done.set()

    threading.Thread(target=loop, name="follow-rank-0", daemon=True).start()
    signalled = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: signalled.set())
    while not done.wait(0.2):
        if signalled.is_set() and not done.wait(grace_s + 5.0):
            log.warning(
                "rank %d: no stop from rank 0 within %.0fs of SIGTERM; exiting",
                ranks.rank,
                grace_s + 5,
            )
            os._exit(1)  # the thread is stuck in a collective: nothing can be unwound cleanly
    if failed:
        log.error("rank %d: lost rank 0: %s", ranks.rank, failed[0])
        return 1
    dist.destroy_process_group()
    log.info("rank %d: stopped", ranks.rank)
    return 0


def stop_followers(ranks: Ranks, timeout_s: float) -> bool:
    """Rank 0, after serving: tell the other ranks to exit, waiting at most `timeout_s` (a
    follower that already died must not keep rank 0 from exiting). True once they have it."""

    def send_stop() -> None:
        ranks.send(STOP, ())
        ranks.leave()

    sender = threading.Thread(target=send_stop, daemon=True)
    sender.start()
    sender.join(timeout_s)
    if sender.is_alive():
        log.warning("the other ranks did not take the stop within %.0fs", timeout_s)
        return False
    dist.destroy_process_group()
    return True

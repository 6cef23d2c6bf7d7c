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

Failure: the ranks fail together, fast. After each operation they agree on how it went (one small
all-reduce over a gloo group): every rank ran it, or every rank refused it with a request error
(AtgrpoError: a checkpoint of another pool, a model that does not load; the pool's state is
unchanged, rank 0 answers its error and the pool serves on). Anything else (an
out-of-memory, a collective that broke or timed out, a bug, one rank refusing alone) ends the rank
at once with FAILED_EXIT and a log line naming the operation and the cause. A rank whose own
operation raised first tells the others through the agreement (for TELL_S at most: they may be
stuck in a training collective, which breaks as soon as this process is gone), so no rank waits
on the next collective; torchrun then ends the group and exits non-zero, and the pod's restart
(LeaderWorkerSet: the group's) brings the pool back, which the router sets up again from the last
checkpoint. Every wait of one rank for the others inside an operation is bounded by the process
group's timeout (--collective-timeout-s), not torch's 30 minutes.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from atgrpo.errors import AtgrpoError

log = logging.getLogger(__name__)

STOP = "stop"
IDLE_TIMEOUT = timedelta(days=365)  # followers wait this long for rank 0's next operation
# How long one rank waits for the others inside an operation (a training collective, the
# agreement after it). The longest such wait that is no fault is a checkpoint save: the shard
# writes end in a collective that waits for the slowest rank, and rank 0 writes the model folder
# alone. A full Qwen3-8B checkpoint is 107 GiB (P x 14 bytes), ~460 s at 250 MB/s onto a shared
# volume; 900 s covers that about twice. Too short kills a healthy pool at every checkpoint (a
# restart loop); too long only lets a hung rank stall the pool longer (15 minutes, not torch's
# 30). A rank that fails, rather than hangs, ends the pool at once whatever this is.
DEFAULT_COLLECTIVE_TIMEOUT_S = 900.0
TIMEOUT_ENV = "ATGRPO_TRAINER_COLLECTIVE_TIMEOUT_S"
FAILED_EXIT = 1
# How long a failing rank offers its verdict before it exits: the others take it at once when
# they finished the operation; when they are stuck in a collective with it instead, its exit
# breaks that collective, so waiting longer only delays the restart.
TELL_S = 2.0
OK, REFUSED, FAILED = 2, 1, 0  # an operation's outcome on one rank; the pool's is the lowest
# Tests only: "RANK:OP:NTH:ACTION" makes rank RANK raise (raise) or hang (stall) as its NTH call
# of pool operation OP starts, a fault on one rank alone (tests/trainer/test_rank_failure.py).
FAULT_ENV = "ATGRPO_TRAINER_INJECT_FAULT"


@dataclass
class Ranks:
    """This process's place in the pool and the channel rank 0 sends operations on."""

    rank: int
    world_size: int
    control: dist.ProcessGroup
    agreement: dist.ProcessGroup | None = None  # gloo, with the collective timeout
    fault: tuple[str, int, str] | None = None  # (op, nth call, action) on this rank: tests only
    _calls: dict[str, int] = field(default_factory=dict)

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

    def agree(self, outcome: int) -> tuple[int, int]:
        """Every rank, after each operation: (lowest, highest) outcome over the ranks, in one
        all-reduce of two integers."""
        both = torch.tensor([outcome, -outcome], dtype=torch.int32)
        dist.all_reduce(both, op=dist.ReduceOp.MIN, group=self.agreement)
        return int(both[0]), -int(both[1])

    def lead(self, ops, op: str, args: tuple):
        """Rank 0: send `op` to the other ranks and run it with them (run_together)."""
        try:
            self.send(op, args)
        except Exception as err:  # a rank is gone: the group is broken
            abort(self.rank, op, f"could not send it to the other ranks ({err})")
        return run_together(self, ops, op, args)


def run_together(ranks: Ranks, ops, op: str, args: tuple):
    """Run PoolOps `op` on this rank while the others run it, then agree on the outcome. Returns
    its result when every rank ran it; raises the request error when every rank refused it (a
    refusal leaves the pool's state as it was); otherwise ends this process (abort)."""
    try:
        _inject_fault(ranks, op)
        result, error, outcome = getattr(ops, op)(*args), None, OK
    except AtgrpoError as err:
        result, error, outcome = None, err, REFUSED
    except Exception as err:  # out of memory, a collective that broke or timed out, a bug
        log.error("rank %d: %s failed", ranks.rank, op, exc_info=True)
        _tell(ranks)
        abort(ranks.rank, op, f"{type(err).__name__}: {err}")
    try:
        low, high = ranks.agree(outcome)
    except Exception as err:
        abort(ranks.rank, op, f"the other ranks did not report how it went ({err})")
    if low == high == OK:
        return result
    if low == high == REFUSED:
        raise error
    if outcome == REFUSED:
        abort(ranks.rank, op, f"refused here alone, while other ranks ran it ({error})")
    abort(ranks.rank, op, "it failed on another rank (see that rank's log)")


def _tell(ranks: Ranks) -> None:
    """A failing rank's FAILED to the agreement, for TELL_S at most (see TELL_S)."""
    teller = threading.Thread(target=lambda: ranks.agree(FAILED), daemon=True)
    teller.start()
    teller.join(TELL_S)


def abort(rank: int, op: str, why: str) -> NoReturn:
    """End this rank now: its part of the pool's state is lost or out of step with the others',
    and the group cannot continue without it. The launcher (torchrun, then the pod's restart)
    brings the pool back; the router sets it up again from the last checkpoint."""
    log.critical(
        "rank %d: pool operation %r failed: %s; exiting (status %d) so that the pool restarts "
        "and resumes from its last checkpoint",
        rank,
        op,
        why,
        FAILED_EXIT,
    )
    logging.shutdown()  # flush: nothing after os._exit does
    os._exit(FAILED_EXIT)  # no unwinding: another thread may be stuck in a collective


def _inject_fault(ranks: Ranks, op: str) -> None:
    if ranks.fault is None or ranks.fault[0] != op:
        return
    ranks._calls[op] = ranks._calls.get(op, 0) + 1
    if ranks._calls[op] != ranks.fault[1]:
        return
    log.warning("rank %d: injected fault: %s in %s (%s)", ranks.rank, ranks.fault[2], op, FAULT_ENV)
    if ranks.fault[2] == "stall":
        threading.Event().wait()  # a rank hung (a stuck kernel, a dead file system)
    raise RuntimeError(f"injected fault in {op} on rank {ranks.rank} ({FAULT_ENV})")


def parse_fault(spec: str, rank: int) -> tuple[str, int, str] | None:
    """FAULT_ENV's value -> this rank's (op, nth, action), or None."""
    if not spec:
        return None
    try:
        who, op, nth, action = spec.split(":")
        at = (int(who), op, int(nth), action)
    except ValueError:
        at = None
    if at is None or at[3] not in ("raise", "stall"):
        raise ValueError(f"{FAULT_ENV}={spec!r}: use RANK:OP:NTH:raise|stall, e.g. 1:train:2:raise")
    return at[1:] if at[0] == rank else None


def check_timeout(seconds: float) -> float:
    """The collective timeout, or ValueError naming the fix."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"--collective-timeout-s {seconds}: give the seconds a rank waits for the others "
            f"inside a pool operation before the pool fails and restarts (> 0; default "
            f"{DEFAULT_COLLECTIVE_TIMEOUT_S:.0f}, or set {TIMEOUT_ENV}), longer than a checkpoint "
            "save takes"
        )
    return seconds


def bind_device() -> None:
    """Make this rank's GPU (LOCAL_RANK) the calling thread's current CUDA device.

    CUDA's current device is per thread, and FSDP2 (its device mesh, its streams) and NCCL take
    theirs from it: a rank whose pool operations run on a thread that never set it runs them on
    cuda:0, beside rank 0. So every thread that works on the model calls this first: the main
    thread, the follower's loop and rank 0's pool-ops thread. Nothing to do without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def init_from_env(timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> Ranks | None:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, MASTER_ADDR ...); None when
    this process is the whole pool. `timeout_s` bounds every collective of an operation."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    timeout = timedelta(seconds=check_timeout(timeout_s))
    bind_device()
    if torch.cuda.is_available():  # gloo for CPU tensors, NCCL for GPU ones
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    # its own group: on the training group a failed rank's verdict could pair with a collective
    # another rank is still in
    agreement = dist.new_group(backend="gloo", timeout=timeout)
    rank = dist.get_rank()
    fault = parse_fault(os.environ.get(FAULT_ENV, ""), rank)
    return Ranks(rank, dist.get_world_size(), control, agreement, fault)


def follow(ranks: Ranks, ops) -> None:
    """Run each operation rank 0 sends on `ops` (a PoolOps) until it sends stop."""
    bind_device()  # this is the thread the operations run on (run_follower starts it)
    while True:
        op, args = ranks.receive()
        if op == STOP:
            ranks.leave()
            return
        try:
            run_together(ranks, ops, op, args)
        except AtgrpoError as err:  # every rank refused it; rank 0 answered the error
            log.info("rank %d: %s refused with the other ranks: %s", ranks.rank, op, err)


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

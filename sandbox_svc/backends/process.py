"""Run one sandboxed command: limits, capped output, a wall clock, and a verdict.

Shared by the bwrap and subprocess backends. The uid switch and the limits are done by `setpriv`
and `prlimit` in front of the command, not in the forked child: a preexec_fn is unsafe in a
multi-threaded server, and Popen's user= forces fork() (instead of vfork), which runs gRPC's
fork handlers in the child, and those crash it. The command starts in its own session so a
timeout can kill its whole process group.
"""

from __future__ import annotations

import ctypes
import math
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from atgrpo.contract.sandbox import ExecResult, Limits, Verdict
from sandbox_svc.languages import Language

PRLIMIT = "/usr/bin/prlimit"
SETPRIV = "/usr/bin/setpriv"
_PR_SET_CHILD_SUBREAPER = 36
_READ_CHUNK = 65536


def as_uid(uid: int | None) -> list[str]:
    """The prefix that runs a command as host `uid` with no supplementary groups."""
    return [] if uid is None else [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def prlimit_argv(limits: Limits) -> list[str]:
    """`prlimit` options for `limits`."""
    cpu = cpu_limit_s(limits)
    return [
        PRLIMIT,
        # Soft = hard: SIGKILL at the limit. A pid-1 program (bwrap --as-pid-1) would ignore a
        # soft limit's SIGXCPU and run on to the hard one.
        f"--cpu={cpu}:{cpu}",
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.max_file_bytes}",
        f"--nofile={limits.max_open_files}",
        f"--nproc={limits.max_processes}",
        "--core=0",
        "--",
    ]


def cpu_limit_s(limits: Limits) -> int:
    """RLIMIT_CPU in whole seconds, as the kernel takes it: the CPU limit rounded up."""
    return max(1, math.ceil(limits.cpu_time_ms / 1000))


@dataclass
class Launch:
    """One command to run as `uid` within `limits`; the caller closes the fds afterwards."""

    argv: Sequence[str]
    stdin_fd: int
    limits: Limits
    language: Language
    cwd: str | None = None
    env: dict[str, str] | None = None
    uid: int | None = None
    pass_fds: tuple[int, ...] = ()


class Output:
    def __init__(self, cap: int):
        self.cap, self.data, self.truncated = cap, bytearray(), False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.truncated = True
        self.data += chunk[: max(room, 0)]


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the program, its process group and every descendant (one that left the group with
    setsid too), at once: `proc` is the program itself (as_uid and prlimit exec it), so nothing
    of its own is left to reap them, and waiting for it to exit would only add to its wall clock
    (a program with a child of its own ran a second past its limit)."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def become_subreaper() -> None:
    """Orphans of sandboxed programs are re-parented to this process (not the host's init, which
    may never reap them), so reap_orphans() can collect them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_orphans(uid: int | None) -> None:
    """Reap this process's zombie children (of `uid`, when given) left by killed programs."""
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE and (uid is None or child.uids().real == uid):
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass


def _exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (so wait4 can still collect its rusage)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def pump(
    streams: Sequence[tuple[int, Output]],
    deadline: float,
    cancel: threading.Event | None,
    exited: Callable[[], bool] | None = None,
) -> str | None:
    """Read the fds until EOF; returns why the program has to be killed ("wall", "cancel",
    "output", "orphans"), or None when it finished within its limits."""
    sel = selectors.DefaultSelector()
    for fd, sink in streams:
        sel.register(fd, selectors.EVENT_READ, sink)
    exited_at = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                return "wall"
            if cancel is not None and cancel.is_set():
                return "cancel"
            # A child left running in the background may hold the pipes open after the program
            # exited: give it a moment, then stop reading (the caller kills what is left).
            if exited is not None:
                if exited_at is None and exited():
                    exited_at = now
                elif exited_at is not None and now - exited_at > 0.2:
                    return "orphans"
            for key, _ in sel.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                key.data.add(chunk)
                if key.data.truncated:
                    return "output"
        return None
    finally:
        sel.close()


def await_end(
    ended: Callable[[float], bool], deadline: float, cancel: threading.Event | None
) -> str | None:
    """After pump saw both pipes close: wait for the program itself to end, as pump would have.
    A program can close its stdout and stderr and run on (sleeping, or spinning below the CPU
    limit): the wall clock and a cancel still stop it. `ended(timeout)` waits up to `timeout`
    seconds for the end and says whether it came. Returns "wall", "cancel", or None."""
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "wall"
        if cancel is not None and cancel.is_set():
            return "cancel"
        if ended(min(0.05, deadline - now)):
            return None


def verdict(
    killed_for: str | None,
    code: int,
    sig: int,
    cpu_ms: int,
    stderr: bytes,
    limits: Limits,
    language: Language,
) -> Verdict:
    if killed_for == "output":
        return Verdict.OUTPUT_LIMIT
    if killed_for == "wall":
        return Verdict.TIMEOUT
    if killed_for == "cancel":
        return Verdict.KILLED
    # RLIMIT_CPU kills with SIGKILL (soft = hard). The kernel checks it against CPU time sampled
    # at its ticks, while rusage reports the scheduler's exact runtime: on a loaded host a
    # program the 1 s limit killed read 797-1014 ms (this project's 2-core VM, load 4.5). So a
    # SIGKILL nobody here sent, past half the limit, is the limit (a program that kills itself
    # there gets TIMEOUT rather than KILLED: a failure either way).
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_ms >= 500 * cpu_limit_s(limits)):
        return Verdict.TIMEOUT
    if sig == signal.SIGXFSZ:
        return Verdict.OUTPUT_LIMIT
    if (code or sig) and any(m in stderr[-8192:] for m in language.oom_markers):
        return Verdict.MEMORY_LIMIT
    if sig:
        return Verdict.KILLED
    return Verdict.RUNTIME_ERROR if code else Verdict.OK


def run_launch(
    launch: Launch,
    cancel: threading.Event | None = None,
    after_kill: Callable[[], None] | None = None,
) -> ExecResult:
    """Run `launch` to completion or to a limit; `after_kill` sweeps what a kill may leave."""
    start = time.monotonic()
    deadline = start + launch.limits.wall_timeout_ms / 1000
    out, err = Output(launch.limits.max_output_bytes), Output(launch.limits.max_output_bytes)
    argv = [*as_uid(launch.uid), *prlimit_argv(launch.limits), *launch.argv]
    proc = subprocess.Popen(
        argv,
        stdin=launch.stdin_fd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=launch.cwd,
        env=launch.env if launch.env is not None else {},
        pass_fds=launch.pass_fds,
        start_new_session=True,
    )
    try:
        killed_for = pump(
            [(proc.stdout.fileno(), out), (proc.stderr.fileno(), err)],
            deadline,
            cancel,
            exited=lambda: _exited(proc.pid),
        )
        if killed_for is None:
            pidfd = os.pidfd_open(proc.pid)
            try:
                killed_for = await_end(
                    lambda t: bool(select.select([pidfd], [], [], t)[0]), deadline, cancel
                )
            finally:
                os.close(pidfd)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    if killed_for is not None:
        _kill_tree(proc)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it is reaped
    if killed_for is not None and after_kill is not None:
        after_kill()
    wall_ms = int((time.monotonic() - start) * 1000)
    cpu_ms = int((usage.ru_utime + usage.ru_stime) * 1000)
    code, sig = (os.WEXITSTATUS(status), 0) if os.WIFEXITED(status) else (0, os.WTERMSIG(status))
    if killed_for == "orphans":  # the program itself finished; only its leftovers were killed
        killed_for = None
    return ExecResult(
        verdict=verdict(
            killed_for, code, sig, cpu_ms, bytes(err.data), launch.limits, launch.language
        ),
        exit_code=code,
        signal=sig,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        wall_ms=wall_ms,
        cpu_ms=cpu_ms,
    )


def memfd_with(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding `data`, positioned at its start."""
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

"""Local services that end with the process that started them.

`atgrpo train` and `atgrpo eval` start their services in sessions of their own (a Ctrl-C in the
terminal is the CLI's to handle), so neither a closed terminal nor `kill -9` of the CLI reaches
them. A pipe does: the launcher holds its write end and never writes; each service gets the read
end (`--parent-fd`) and a thread reads it. The read returns end-of-file when the last write end is
closed, which the kernel does for a process however it dies, in whatever session or thread.

Two pipes order the stop. The router, which drives the run, watches the launcher's pipe; the
others watch a second pipe whose write end the launcher *and the router* hold. So once the launcher
is gone the router finishes what is in flight and stops, and the services it calls stop only
when it has gone too.

The parent-death signal (prctl PR_SET_PDEATHSIG) was not used: it fires when the *thread* that
forked the child exits, not the process, and does not reach a process that re-execs under setsid.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("atgrpo.tether")

# Services that drive a run: they stop first, and the others stop once these have gone.
LEADERS = frozenset({"router"})
# past the drain and the stop's grace: a process stuck in its stop exits anyway
HARD_EXIT_MARGIN_S = 30.0


class Tether:
    """The launcher's side: the two pipes, and the flag and descriptors each service gets."""

    def __init__(self) -> None:
        # os.pipe() descriptors are not inheritable: only the children given them (pass_fds) hold
        # them.
        self.launcher_r, self.launcher_w = os.pipe()
        self.leaders_r, self.leaders_w = os.pipe()
        self.closed = False

    def for_kind(self, kind: str) -> tuple[list[str], tuple[int, ...]]:
        """(extra argv, descriptors to pass) for a service of `kind`."""
        if kind in LEADERS:
            # The leader keeps the other pipe's write end open just by holding it, until it exits.
            return ["--parent-fd", str(self.launcher_r)], (self.launcher_r, self.leaders_w)
        return ["--parent-fd", str(self.leaders_r)], (self.leaders_r,)

    def close(self) -> None:
        """Let go of the services: those still running stop as if the launcher had died."""
        if not self.closed:
            self.closed = True
            for fd in (self.launcher_r, self.launcher_w, self.leaders_r, self.leaders_w):
                os.close(fd)


def pass_fds_of(argv: Sequence[str], tether: Tether | None, kind: str) -> tuple[int, ...]:
    """The descriptors a (re)started service with this argv needs; an error says what is missing."""
    if "--parent-fd" not in argv:
        return ()
    if tether is None or tether.closed:
        raise RuntimeError(
            f"{kind}: its argv has --parent-fd but the launcher has no open Tether to pass"
        )
    return tether.for_kind(kind)[1]


def _read_to_eof(fd: int) -> None:
    try:
        while os.read(fd, 4096):  # nothing is ever written; b"" once every write end is closed
            pass
    except OSError as err:  # the descriptor went bad: as good as gone
        log.warning("reading the launcher's pipe (fd %d) failed: %s", fd, err)


def watch(fd: int, on_gone: Callable[[], Any], *, hard_exit_after_s: float) -> threading.Thread:
    """The service's side: when `fd` reaches end-of-file call `on_gone()` (from this thread); if
    the process still runs `hard_exit_after_s` later, exit it at once."""
    os.set_inheritable(fd, False)  # the service's own children must not keep it open

    def run() -> None:
        _read_to_eof(fd)
        on_gone()
        time.sleep(hard_exit_after_s)
        log.error("still running %.0f s after the launcher went: exiting now", hard_exit_after_s)
        logging.shutdown()
        os._exit(1)

    thread = threading.Thread(target=run, name="atgrpo-tether", daemon=True)
    thread.start()
    return thread


async def drain_then_stop(servicers: Sequence[Any], drain_s: float) -> None:
    """Give servicers with an `async on_launcher_gone()` (the router: end its run after the step in
    flight, with a checkpoint) up to `drain_s`, then SIGTERM this process: its normal stop."""
    hooks = [s.on_launcher_gone() for s in servicers if hasattr(s, "on_launcher_gone")]
    log.warning(
        "the process that started this service is gone: stopping%s",
        f" once the work in flight is done (at most {drain_s:.0f} s)" if hooks else "",
    )
    if hooks:
        try:
            await asyncio.wait_for(asyncio.gather(*hooks), drain_s)
        except TimeoutError:
            log.warning("the work in flight did not end within %.0f s: stopping anyway", drain_s)
        except Exception:
            log.exception("draining before the stop failed: stopping anyway")
    os.kill(os.getpid(), signal.SIGTERM)

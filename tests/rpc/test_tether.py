"""atgrpo.rpc.tether's pieces in this process: the watch, the drain, the flag."""

import asyncio
import os
import signal
import threading

import pytest

from atgrpo.rpc import tether
from atgrpo.rpc.main import parse


def test_the_watch_fires_when_the_last_write_end_closes():
    r, w = os.pipe()
    gone = threading.Event()
    tether.watch(r, gone.set, hard_exit_after_s=3600)
    assert not gone.wait(0.3)
    os.close(w)
    assert gone.wait(5)


def test_servicers_drain_before_the_stop(monkeypatch):
    sent, order = [], []
    monkeypatch.setattr(
        tether.os, "kill", lambda pid, sig: (sent.append((pid, sig)), order.append("SIGTERM"))
    )

    class Draining:
        async def on_launcher_gone(self):
            await asyncio.sleep(0.05)
            order.append("drained")

    class Stuck:
        async def on_launcher_gone(self):
            await asyncio.sleep(3600)

    asyncio.run(tether.drain_then_stop([Draining(), object()], drain_s=5))
    assert order == ["drained", "SIGTERM"] and sent == [(os.getpid(), signal.SIGTERM)]
    asyncio.run(tether.drain_then_stop([Stuck()], drain_s=0.1))  # bounded: stops anyway
    assert order[-1] == "SIGTERM" and len(sent) == 2


def test_a_parent_fd_that_is_not_open_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse("router", argv=["--parent-fd", "987"])
    assert "--parent-fd 987: not an open file descriptor" in capsys.readouterr().err


def test_only_leaders_hold_the_followers_pipe():
    t = tether.Tether()
    try:
        argv, fds = t.for_kind("router")
        assert argv == ["--parent-fd", str(t.launcher_r)] and t.leaders_w in fds
        argv, fds = t.for_kind("trainer")
        assert argv == ["--parent-fd", str(t.leaders_r)] and fds == (t.leaders_r,)
        assert tether.pass_fds_of(["x", "--parent-fd", str(t.leaders_r)], t, "env") == (
            t.leaders_r,
        )
    finally:
        t.close()
    with pytest.raises(RuntimeError, match="no open Tether"):
        tether.pass_fds_of(["--parent-fd", "3"], t, "env")

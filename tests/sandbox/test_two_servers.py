"""Two sandbox servers on one host, both started with default flags (as two `atgrpo train` runs,
or a bench beside a run, start them): neither may touch the other's programs.

The reproduction from the outside runs: server A's program leaves a SysV semaphore, so A discards
its sandbox and sweeps its slot's uid; when both servers used uid 60000, that killed B's running
program (re-run silently after one hit, KILLED after two). Stopping A must not touch B either."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from atgrpo.contract.sandbox import Limits, Verdict
from sandbox_svc.client import SandboxClient
from sandbox_svc.uids import UidClaimError, claim

LEAVE_SEMAPHORE = "import ctypes\nprint(ctypes.CDLL(None).semget(0x1234, 1, 0o1666) >= 0)\n"
# A silent re-run of B's program shows as a wall time past twice its sleep.
SLOW = "import time\ntime.sleep(3)\nprint('B done')\n"
LIMITS = Limits(wall_timeout_ms=20_000, cpu_time_ms=2000)


def _serve(tmp_path, name, env, *flags):
    port_file = tmp_path / f"{name}.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_svc",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--workers",
            "1",
            *flags,
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sandbox {name} did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    proc.address = f"127.0.0.1:{json.loads(port_file.read_text())['port']}"
    return proc


def _stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.communicate(timeout=15)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


@pytest.fixture
def two_servers(tmp_path, subprocess_env):
    env = {**subprocess_env, "ATGRPO_LOG_LEVEL": "INFO"}
    a = _serve(tmp_path, "a", env)
    b = _serve(tmp_path, "b", env)
    yield a, b
    for proc in (a, b):
        _stop(proc)


async def _b_runs_while_a_discards_twice(a_addr: str, b_addr: str, stop_a=None):
    async with SandboxClient(a_addr) as a, SandboxClient(b_addr) as b:
        slow = asyncio.ensure_future(b.execute(SLOW, limits=LIMITS))
        await asyncio.sleep(0.8)  # B's program is running
        for _ in range(2):
            r = await a.execute(LEAVE_SEMAPHORE)
            assert r.verdict is Verdict.OK and r.stdout == b"True\n", r
            await asyncio.sleep(0.3)
        if stop_a is not None:
            stop_a()
        start = time.monotonic()
        result = await slow
        return result, time.monotonic() - start


@pytest.mark.skipif(
    os.geteuid() != 0, reason="host uids per slot are used only when the server runs as root"
)
def test_a_discarding_its_sandbox_never_touches_b(two_servers):
    a, b = two_servers
    result, _ = asyncio.run(_b_runs_while_a_discards_twice(a.address, b.address))
    assert (result.verdict, result.stdout) == (Verdict.OK, b"B done\n"), result
    assert result.wall_ms < 5000, f"B's program ran {result.wall_ms} ms: it was run again"


@pytest.mark.skipif(
    os.geteuid() != 0, reason="host uids per slot are used only when the server runs as root"
)
def test_stopping_a_never_touches_b(two_servers):
    a, b = two_servers
    result, _ = asyncio.run(
        _b_runs_while_a_discards_twice(a.address, b.address, stop_a=lambda: a.terminate())
    )
    assert (result.verdict, result.stdout) == (Verdict.OK, b"B done\n"), result
    logs = _stop(a) + _stop(b)
    uids = sorted(
        {
            int(line.split("host uids ")[1].split("-")[0])
            for line in logs.splitlines()
            if "host uids " in line
        }
    )
    assert len(uids) == 2, logs[-3000:]  # two different ranges, each said in the log


def test_a_taken_range_is_refused_with_its_holder_and_freed_when_the_holder_exits(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("sandbox_svc.uids.LOCK_DIR", tmp_path)
    first = claim(4)
    assert first.base == 60000
    second = claim(2)
    assert second.base == 60004  # the next free range, not an overlap
    with pytest.raises(
        UidClaimError, match=rf"host uid 60002 .* held by another sandbox \(pid {os.getpid()}\)"
    ):
        claim(2, base=60002)
    # Another process's claim: gone with that process, however it ends.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.path.insert(0, sys.argv[1]); import sandbox_svc.uids as u; "
            "from pathlib import Path; u.LOCK_DIR = Path(sys.argv[2]); h = u.claim(2, 61000); "
            "print(h.base, flush=True); time.sleep(60)",
            os.getcwd(),
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "61000"
    with pytest.raises(UidClaimError, match=f"pid {child.pid}"):
        claim(1, base=61001)
    child.kill()
    child.wait()
    assert claim(2, base=61000).base == 61000
    first.close()
    assert claim(4).base == 60000  # released by close() too


def test_an_unusable_lock_directory_is_refused_naming_the_setting(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr("sandbox_svc.uids.LOCK_DIR", tmp_path / "a-file" / "uids")
    with pytest.raises(UidClaimError, match="ATGRPO_SANDBOX_UID_DIR"):
        claim(1)

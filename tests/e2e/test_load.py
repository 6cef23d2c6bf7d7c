"""Load: env_svc at its episode cap, and a long local run whose memory stays flat."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import psutil
import pytest

from atgrpo import errors
from atgrpo.cli import launcher
from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import parse_config
from atgrpo.rundir import read_metrics
from atgrpo.sdk.client import EnvClient
from tests.e2e.toy_runs import Collect, toy_config

pytestmark = pytest.mark.slow

CAP = 10_000
MEMORY_BOUND = 256 * 2**20  # env_svc with CAP live toy episodes (measured: about 60 MiB)


def start_env(tmp_path, subprocess_env, cap: int) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / "env.port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "env_svc",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--port-file",
            str(port_file),
            "--max-episodes",
            str(cap),
        ],
        env=subprocess_env,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc, f"127.0.0.1:{json.loads(port_file.read_text())['port']}"


def test_env_svc_holds_ten_thousand_episodes_and_refuses_the_next(tmp_path, subprocess_env):
    proc, address = start_env(tmp_path, subprocess_env, CAP)

    async def go():
        async with EnvClient(address) as env:
            env.retry = False
            gate = asyncio.Semaphore(64)

            async def one(i):
                async with gate:
                    return (await env.reset("toy", f"t{i}", i))[0]

            ids = await asyncio.gather(*(one(i) for i in range(CAP)))
            rss = psutil.Process(proc.pid).memory_info().rss
            with pytest.raises(errors.ResourceExhausted, match="episodes"):
                await env.reset("toy", "one-too-many", CAP)
            await env.close_episodes(ids[:10])
            # room again, and still serving
            again = (await env.reset("toy", "after-close", CAP + 1))[0]
            return len(set(ids)), rss, again

    try:
        distinct, rss, again = asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert distinct == CAP and again
    print(f"env_svc with {CAP} episodes: {rss / 2**20:.0f} MiB")
    assert rss < MEMORY_BOUND, f"{rss / 2**20:.0f} MiB for {CAP} episodes"


def test_a_long_local_run_holds_its_memory_flat(tiny_model, tmp_path):
    """Every service's memory after step 40 is within 10% (+16 MiB) of what it was at step 10."""
    data = toy_config(tmp_path / "run", tiny_model, "L1", steps=40, save_samples=False)
    cfg = parse_config(data)
    marks: dict[int, dict[str, int]] = {}
    stop = threading.Event()

    def sample():
        state = tmp_path / "run" / "services"
        while not stop.is_set():
            steps = [
                e["step"]
                for e in read_metrics(tmp_path / "run" / "metrics.jsonl")
                if e["kind"] == "step"
            ]
            done = max(steps, default=0)
            for mark in (10, 40):
                if done >= mark and mark not in marks:
                    marks[mark] = {
                        s.name: psutil.Process(s.pid).memory_info().rss
                        for s in launcher.read_state(state)
                    }
            time.sleep(0.1)

    with LocalServices(cfg) as running:
        thread = threading.Thread(target=sample)
        thread.start()
        try:
            final = asyncio.run(drive(running, Collect()))
            deadline = time.monotonic() + 10
            while 40 not in marks and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join()
    assert final["state"] == "finished"
    for name, early in marks[10].items():
        late = marks[40][name]
        print(f"{name}: {early / 2**20:.0f} MiB at step 10, {late / 2**20:.0f} MiB at step 40")
        assert late <= early * 1.10 + 16 * 2**20, (
            f"{name}: {early / 2**20:.0f} -> {late / 2**20:.0f} MiB"
        )

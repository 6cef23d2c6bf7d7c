"""Local services end with the process that started them (atgrpo.rpc.tether), and
`atgrpo down --run-dir` stops any a run left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from atgrpo.cli import launcher
from atgrpo.cli.launcher import ServiceProcess
from atgrpo.rpc.tether import Tether
from atgrpo.rundir import read_metrics
from tests.e2e.toy_runs import toy_config

pytestmark = pytest.mark.slow

# Two of the lightest services: the router (a leader) and one it would call.
PLAN = (ServiceProcess("sandbox", "sandbox"), ServiceProcess("router", "router"))


def _wait(what: str, done, timeout_s: float, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = done()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def _alive(services: list[launcher.LocalService]) -> list[str]:
    return [s.name for s in services if launcher.is_ours(s)]


def test_services_of_a_killed_train_stop_by_themselves(tiny_model, tmp_path, subprocess_env):
    run_dir = tmp_path / "run"
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(toy_config(run_dir, tiny_model, "L1", steps=30)))
    train = subprocess.Popen(
        [sys.executable, "-m", "atgrpo.cli", "train", str(config)],
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(
            "a first step",
            lambda: (
                train.poll() is None
                and any(e["kind"] == "step" for e in read_metrics(run_dir / "metrics.jsonl"))
            ),
            120,
        )
    finally:
        train.send_signal(signal.SIGKILL)  # kill -9: no `finally`, no atexit, no `down`
        _, err = train.communicate()
    services = launcher.read_state(run_dir / "services")
    assert sorted(s.name for s in services) == [
        "env",
        "rollout-a-0",
        "router",
        "sandbox",
        "trainer-a",
    ], err
    try:
        _wait("every service of the run stopped", lambda: not _alive(services), 30)
    finally:
        launcher.down(run_dir / "services", timeout_s=5)  # leave nothing behind, even on failure
    # The router ended the run after the step in flight, with a checkpoint of it: a resume loses
    # nothing.
    last = max(e["step"] for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "step")
    assert last < 30 and (run_dir / "checkpoints" / f"step-{last:06d}").is_dir(), sorted(
        p.name for p in (run_dir / "checkpoints").iterdir()
    )


def test_the_router_stops_first_and_the_others_after_it(tmp_path, subprocess_env, monkeypatch):
    for key, value in subprocess_env.items():
        monkeypatch.setenv(key, value)
    tether = Tether()
    try:
        services = launcher.up(tmp_path, PLAN, timeout_s=60, tether=tether)
        router = next(s for s in services if s.name == "router")
        os.kill(router.pid, signal.SIGSTOP)  # a router busy with its step: it cannot stop yet
        tether.close()  # as the launcher's death closes it
        time.sleep(2.0)
        assert _alive(services) == ["sandbox", "router"], (
            "the sandbox went while the router still ran"
        )
        os.kill(router.pid, signal.SIGCONT)
        _wait("both stopped", lambda: not _alive(services), 30)
    finally:
        tether.close()
        launcher.down(tmp_path, timeout_s=5)


def test_down_with_run_dir_stops_what_a_run_left(tmp_path, subprocess_env, monkeypatch):
    for key, value in subprocess_env.items():
        monkeypatch.setenv(key, value)
    run_dir: Path = tmp_path / "run"
    # untethered: as if left behind
    services = launcher.up(run_dir / "services", PLAN, timeout_s=60)
    try:
        down = subprocess.run(
            [sys.executable, "-m", "atgrpo.cli", "down", "--run-dir", str(run_dir)],
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert down.returncode == 0, down.stderr
        for s in services:
            assert f"{s.name:<8} pid {s.pid:<7} stopped" in down.stdout, down.stdout
        _wait("both stopped", lambda: not _alive(services), 10)
        again = subprocess.run(
            [sys.executable, "-m", "atgrpo.cli", "down", "--run-dir", str(run_dir)],
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 0 and "no services recorded" in again.stdout
    finally:
        launcher.down(run_dir / "services", timeout_s=5)

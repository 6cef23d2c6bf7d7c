"""`atgrpo up / status / down` as a user runs them: subprocesses, real services, no leftovers."""

import json
import subprocess
import sys
import time

import psutil
import pytest

from atgrpo import local
from tests.conftest import SERVICE_KINDS


def atgrpo(*args, env, timeout=90):
    return subprocess.run([sys.executable, "-m", "atgrpo.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _service_pids() -> set[int]:
    """Every process on the machine running one of our service modules."""
    pids = set()
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(f"{k}_svc" in part for part in cmd for k in SERVICE_KINDS) and "-m" in cmd:
            pids.add(p.pid)
    return pids


def test_up_status_down_leaves_no_process_behind(tmp_path, subprocess_env):
    state = tmp_path / "state"
    before = _service_pids()
    up = atgrpo("up", "--state-dir", str(state), env=subprocess_env)
    assert up.returncode == 0, up.stderr
    recorded = json.loads((state / "services.json").read_text())["services"]
    assert sorted(s["kind"] for s in recorded) == sorted(SERVICE_KINDS)
    pids = {s["pid"] for s in recorded}
    assert pids <= _service_pids() - before

    status = atgrpo("status", "--state-dir", str(state), "--json", env=subprocess_env)
    assert status.returncode == 0, status.stdout + status.stderr
    probes = json.loads(status.stdout)
    assert {p["name"]: p["health"] for p in probes} == {k: "SERVING" for k in SERVICE_KINDS}

    again = atgrpo("up", "--state-dir", str(state), env=subprocess_env)
    assert again.returncode == 1 and "already running" in again.stderr

    down = atgrpo("down", "--state-dir", str(state), env=subprocess_env)
    assert down.returncode == 0
    assert down.stdout.count("stopped") == len(SERVICE_KINDS)
    gone_by = time.monotonic() + 10
    while pids & {p.pid for p in psutil.process_iter()} and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not pids & {p.pid for p in psutil.process_iter() if p.status() != psutil.STATUS_ZOMBIE}
    assert _service_pids() - before == set()
    assert not (state / "services.json").exists()

    after = atgrpo("status", "--state-dir", str(state), env=subprocess_env)
    assert after.returncode == 1 and "run `atgrpo up`" in after.stderr


def test_status_reports_a_dead_address_as_down(subprocess_env):
    out = atgrpo("status", "--address", "env=127.0.0.1:1", "--timeout-s", "1", env=subprocess_env)
    assert out.returncode == 1
    assert "DOWN" in out.stdout


def test_down_leaves_a_reused_pid_alone(tmp_path):
    """A recorded pid whose start time differs is someone else's process now: never signal it."""
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        state = tmp_path / "state"
        state.mkdir()
        stale = local.LocalService("env", "env", bystander.pid, create_time=1.0, address="127.0.0.1:1",
                                   metrics_address="", log="")
        local._write_state(state, [stale])
        assert local.down(state) == {"env": "not running"}
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_service_that_fails_to_start_is_reported_and_nothing_is_left(tmp_path):
    plan = (local.ServicePlan("env", "env"), local.ServicePlan("broken", "env", ("--no-such-flag",)))
    before = _service_pids()
    with pytest.raises(local.LaunchError, match=r"(?s)broken exited with code 2.*unrecognized arguments: --no-such-flag"):
        local.up(tmp_path, plan, timeout_s=30)
    assert _service_pids() - before == set()
    assert local.read_state(tmp_path) == []

"""`atgrpo up / status / down` as a user runs them: subprocesses, real services, no leftovers."""

import dataclasses
import json
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from atgrpo.cli import launcher
from tests.conftest import SERVICE_KINDS


def atgrpo(*args, env, timeout=90):
    return subprocess.run(
        [sys.executable, "-m", "atgrpo.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _service_pids(mark: str) -> set[int]:
    """Every process running one of our service modules with `mark` in its environment.

    The mark keeps out the services another pytest worker starts at the same time.
    """
    pids = set()
    for p in psutil.process_iter(["cmdline", "environ"]):
        cmd = p.info["cmdline"] or []
        if any(f"{k}_svc" in part for part in cmd for k in SERVICE_KINDS) and "-m" in cmd:
            if (p.info["environ"] or {}).get("ATGRPO_TEST_MARK") == mark:
                pids.add(p.pid)
    return pids


def test_up_status_down_leaves_no_process_behind(tmp_path, subprocess_env):
    state = tmp_path / "state"
    mark = str(tmp_path)
    subprocess_env = {**subprocess_env, "ATGRPO_TEST_MARK": mark}
    before = _service_pids(mark)
    up = atgrpo("up", "--state-dir", str(state), env=subprocess_env)
    assert up.returncode == 0, up.stderr
    recorded = json.loads((state / "services.json").read_text())["services"]
    assert sorted(s["kind"] for s in recorded) == sorted(SERVICE_KINDS)
    pids = {s["pid"] for s in recorded}
    by_kind = {s["kind"]: s for s in recorded}
    rollout_argv = by_kind["rollout"]["argv"]
    # Collect has an env
    assert rollout_argv[rollout_argv.index("--env") + 1] == by_kind["env"]["address"]
    assert pids <= _service_pids(mark) - before

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
    assert _service_pids(mark) - before == set()
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
        stale = launcher.LocalService(
            "env",
            "env",
            bystander.pid,
            create_time=1.0,
            address="127.0.0.1:1",
            metrics_address="",
            log="",
        )
        launcher._write_state(state, [stale])
        assert launcher.down(state) == {"env": "not running"}
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_service_stays_ours_when_the_wall_clock_moves():
    """psutil's create time is the boot time plus the start after boot, and the kernel's boot time
    moves when the wall clock is adjusted (49 s once, here, mid-run: the supervisor then took every
    service for dead). The start after boot does not move."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        created, since = launcher._identity(proc.pid)
        assert since > 0
        moved = launcher.LocalService(
            "env", "env", proc.pid, created - 49.0, "127.0.0.1:1", "", "", started=since
        )
        assert launcher.is_ours(moved)
        assert not launcher.is_ours(dataclasses.replace(moved, started=since - 1.0))  # a reused pid
        # an older record
        assert launcher.is_ours(dataclasses.replace(moved, create_time=created, started=-1.0))
    finally:
        proc.kill()
        proc.wait()


def test_a_service_that_fails_to_start_is_reported_and_nothing_is_left(tmp_path, monkeypatch):
    mark = str(tmp_path)
    monkeypatch.setenv("ATGRPO_TEST_MARK", mark)  # the services inherit it
    plan = (
        launcher.ServiceProcess("env", "env"),
        launcher.ServiceProcess("broken", "env", ("--no-such-flag",)),
    )
    before = _service_pids(mark)
    with pytest.raises(
        launcher.LaunchError,
        match=r"(?s)broken exited with code 2.*unrecognized arguments: --no-such-flag",
    ):
        launcher.up(tmp_path, plan, timeout_s=30)
    assert _service_pids(mark) - before == set()
    assert launcher.read_state(tmp_path) == []


def toy_run(model: str, run_dir, name: str) -> dict:
    """An L0 toy run on the tiny model on CPU, two short steps (as tests/e2e/test_training.py)."""
    return {
        "run": {
            "name": name,
            "seed": 0,
            "steps": 2,
            "tasks_per_step": 2,
            "eval_every_steps": 0,
            "checkpoint_every_steps": 0,
            "run_dir": str(run_dir),
        },
        "env": {"name": "toy", "turn_order": ["speaker"], "max_turns": 1},
        "pools": {
            "a": {
                "model_path": model,
                "device": "cpu",
                "dtype": "float32",
                "optim": {"lr": 5e-4, "warmup_steps": 0},
            }
        },
        "agents": {
            "speaker": {
                "pool": "a",
                "train_sampling": {"temperature": 1.0, "max_tokens": 4},
                "eval_sampling": {"max_tokens": 4},
            }
        },
        "algorithm": {"k": 2, "mini_batch_size": 64},
    }


def test_up_then_train_connect_then_down(tmp_path, subprocess_env, tiny_model):
    """The documented flow: `atgrpo up CONFIG`, its services: block into the config, `atgrpo train
    CONFIG --connect` against them (no service of its own), `atgrpo down`."""
    state, config = tmp_path / "state", tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(toy_run(tiny_model, tmp_path / "run", "up-connect")))
    recorded = []
    try:
        up = atgrpo("up", str(config), "--state-dir", str(state), env=subprocess_env)
        assert up.returncode == 0, up.stderr
        recorded = launcher.read_state(state)
        assert {s.name for s in recorded} == {
            "sandbox",
            "env",
            "rollout-a-0",
            "trainer-a",
            "router",
        }
        env_address = next(s.address for s in recorded if s.name == "env")
        rollout = next(s for s in recorded if s.kind == "rollout")
        assert rollout.argv[rollout.argv.index("--env") + 1] == env_address

        status = atgrpo("status", "--state-dir", str(state), "--json", env=subprocess_env)
        assert status.returncode == 0, status.stdout + status.stderr
        by_name = {p["name"]: p["address"] for p in json.loads(status.stdout)}

        services = yaml.safe_load(up.stdout.split("--connect`:\n", 1)[1])["services"]
        assert services == {
            "env": by_name["env"],
            "sandbox": by_name["sandbox"],
            "router": by_name["router"],
            "rollout": {"a": [by_name["rollout-a-0"]]},
            "trainer": {"a": by_name["trainer-a"]},
        }
        config.write_text(
            yaml.safe_dump({**yaml.safe_load(config.read_text()), "services": services})
        )

        train = atgrpo("train", str(config), "--connect", env=subprocess_env, timeout=120)
        assert train.returncode == 0, train.stdout + train.stderr
        events = [
            json.loads(line)
            for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2], events
        assert "services locally" not in train.stderr  # it drove ours, started none
        assert all(launcher.is_ours(s) for s in recorded)

        # Another run on the same long-lived trainer is refused, and the message says what to do.
        other = tmp_path / "other.yaml"
        other.write_text(
            yaml.safe_dump(
                {**toy_run(tiny_model, tmp_path / "other", "other-run"), "services": services}
            )
        )
        refused = atgrpo(
            "train", str(other), "--connect", "--steps", "1", env=subprocess_env, timeout=120
        )
        assert refused.returncode == 1
        said = refused.stdout + refused.stderr
        assert (
            "serves run 'up-connect'" in said and "atgrpo down" in said and "atgrpo up" in said
        ), said
    finally:
        down = atgrpo("down", "--state-dir", str(state), env=subprocess_env)
    assert down.returncode == 0 and down.stdout.count("stopped") == 5, down.stdout
    gone_by = time.monotonic() + 10
    while any(launcher.is_ours(s) for s in recorded) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not [s.name for s in recorded if launcher.is_ours(s)]
    assert not (state / "services.json").exists()

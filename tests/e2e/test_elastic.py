"""A rollout fleet that grows and shrinks during a local run (issue 39, item 1), all real processes:

    step 1     one replica
    then       `atgrpo scale a 2`: the new replica gets every adapter (pinned version), then work
    then       kill -9 of that replica while it generates: its unfinished tasks go to the other,
               the supervisor restarts it, it is synced again before it gets work
    next step  a replica joins and hangs in its weight load (tests/e2e/hanging_replica.py); kill -9
               there: the trainer leaves it out
    next step  `atgrpo scale a 1`: the added replica is taken off the list, then stopped
    next step  the run is stopped

The run records every step exactly once, each step's own tasks each once, every sample drawn from
the weights the step trained from (synchronous), and says how many replicas each step ran on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from atgrpo.cli import launcher
from atgrpo.cli.runner import LocalServices, run_until, write_replica_list
from atgrpo.cli.scale import scale
from atgrpo.config import parse_config
from atgrpo.discovery import read_address_file
from atgrpo.rundir import read_metrics
from router_svc.steps import step_tasks
from tests.e2e.toy_runs import toy_config

pytestmark = pytest.mark.slow

MAX_STEPS = 40  # the run is stopped one step after the last change


def steps_done(run_dir: Path) -> list[int]:
    return [e["step"] for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "step"]


def wait_for(what, stop: threading.Event, timeout_s: float = 300.0):
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(what)


def generating(svc: launcher.LocalService) -> bool:
    """The replica has requests in its engine now: a Collect of it is under way."""
    try:
        text = urllib.request.urlopen(f"http://{svc.metrics_address}/metrics", timeout=2).read()
    except OSError:
        return False
    for line in text.decode().splitlines():
        if line.startswith(("atgrpo_rollout_requests_running", "atgrpo_rollout_requests_waiting")):
            if float(line.rsplit(" ", 1)[1]) > 0:
                return True
    return False


def hanging_replica(state_dir: Path) -> tuple[subprocess.Popen, str, Path]:
    port_file, marker = state_dir / "hanging.port.json", state_dir / "hanging.loading"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.hanging_replica", "--port-file", str(port_file)]
        + ["--marker", str(marker)],
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, f"127.0.0.1:{json.loads(port_file.read_text())['port']}", marker


def conductor(run_dir: Path, log: list[str], done_at: list[int], stop: threading.Event) -> None:
    """Each change after the step that followed the one before; `done_at` gets the last step
    completed when all were made (the run stops after the next)."""
    state_dir, listing = run_dir / "services", run_dir / "services" / "replicas" / "a.txt"

    def after_next_step():
        now = max(steps_done(run_dir), default=0)
        wait_for(lambda: max(steps_done(run_dir), default=0) > now, stop)

    wait_for(lambda: steps_done(run_dir), stop)
    log.append(f"scaled to {len(scale(run_dir, 'a', 2))}")

    added = next(s for s in launcher.read_state(state_dir) if s.name == "rollout-a-1")
    wait_for(lambda: generating(added), stop)  # it serves the run's weights and has work
    os.kill(added.pid, signal.SIGKILL)
    log.append("killed rollout-a-1 while it generated")

    after_next_step()
    proc, address, marker = hanging_replica(state_dir)
    try:
        write_replica_list(listing, [*read_address_file(str(listing)), address])
        wait_for(marker.exists, stop)
        proc.kill()
        log.append("killed a joining replica during its weight load")
    finally:
        proc.kill()
        proc.wait()
    write_replica_list(listing, [a for a in read_address_file(str(listing)) if a != address])

    after_next_step()
    log.append(f"scaled to {len(scale(run_dir, 'a', 1))}")
    done_at.append(max(steps_done(run_dir)))


def test_replicas_join_and_leave_mid_run_and_nothing_is_lost_or_repeated(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    data = toy_config(run_dir, tiny_model, "L2", steps=MAX_STEPS, tasks_per_step=8)
    cfg = parse_config(data)
    log: list[str] = []
    done_at: list[int] = []
    stop = threading.Event()
    services = LocalServices(cfg)
    with services as running:
        thread = threading.Thread(target=conductor, args=(run_dir, log, done_at, stop))
        thread.start()
        try:
            final = asyncio.run(
                run_until(running, lambda e: bool(done_at) and e.get("step", 0) > done_at[0])
            )
        finally:
            stop.set()
            thread.join()
        left = [s.name for s in launcher.read_state(run_dir / "services") if s.kind == "rollout"]
        listed = read_address_file(str(run_dir / "services" / "replicas" / "a.txt"))
    assert log == [
        "scaled to 2",
        "killed rollout-a-1 while it generated",
        "killed a joining replica during its weight load",
        "scaled to 1",
    ]
    assert final["state"] == "stopped", final
    assert left == ["rollout-a-0"] and len(listed) == 1
    events = read_metrics(run_dir / "metrics.jsonl")
    assert [e for e in events if e["kind"] == "rollback"] == []  # no step trained twice
    steps = [e for e in events if e["kind"] == "step"]
    n = len(steps)
    assert n > done_at[0] and [e["step"] for e in steps] == list(range(1, n + 1))  # each once
    assert [e["pools"]["a"]["version"] for e in steps] == list(range(1, n + 1))
    for e in steps:
        path = run_dir / "samples" / f"step-{e['step']:06d}.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        planned = [t.task_id for t in step_tasks(cfg.run.seed, e["step"] - 1, 8)]
        assert sorted({x["task_id"] for x in lines}) == sorted(planned)  # its own tasks
        # each task's samples from one tree: no (agent, turn, branch) twice, as two trees' would
        keys = [(x["task_id"], x["episode"], x["agent"], x["turn"], x["branch"]) for x in lines]
        assert len(keys) == len(set(keys))
        assert all(x["policy"]["version"] == e["step"] - 1 for x in lines)  # on-policy
        assert sum(e["pools"]["a"]["agents"].values()) == len(lines)
    replicas = [e["replicas"]["a"] for e in steps]
    assert replicas[0] == 1 and 2 in replicas and replicas[-1] == 1
    assert sum(e["requeued_tasks"] for e in steps) >= 1  # the kill mid-generation moved tasks
    assert services.supervisor.restarts.get("rollout-a-1") == 1

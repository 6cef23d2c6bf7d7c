"""Faults: kill -9 each service in turn during a local training run. The launcher restarts what
died on its old ports, clients retry, the router recovers (a restarted trainer loads the last
checkpoint, every pool rolls back to it) and the watcher reconnects to a restarted router. The
run finishes with every step recorded exactly once and every step's samples trained."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest

from atgrpo.cli import launcher
from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import parse_config
from atgrpo.rundir import read_metrics
from router_svc.steps import step_tasks
from tests.e2e.toy_runs import Collect, toy_config

pytestmark = pytest.mark.slow

VICTIMS = ["env", "sandbox", "rollout-a-1", "trainer-a", "router"]  # in the order they are killed
STEPS = 2 * len(VICTIMS) + 2


def killer(state_dir, metrics, killed: list[str], stop: threading.Event) -> None:
    """After every second completed step, SIGKILL the next victim (whatever its current pid)."""
    for i, name in enumerate(VICTIMS):
        while not stop.is_set():
            steps = [e["step"] for e in read_metrics(metrics) if e["kind"] == "step"]
            if steps and max(steps) >= 2 * (i + 1):
                break
            time.sleep(0.2)
        if stop.is_set():
            return
        svc = next(s for s in launcher.read_state(state_dir) if s.name == name)
        os.kill(svc.pid, signal.SIGKILL)
        killed.append(name)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_run_survives_kill_9_of_every_service(max_staleness, tiny_model, tmp_path):
    """Asynchronous (max_staleness 1) checkpoints every third step, so kills land while collection
    runs ahead of training and a lost trainer rolls two steps back."""
    data = toy_config(
        tmp_path / "run",
        tiny_model,
        "L1",
        steps=STEPS,
        checkpoint_every_steps=3 if max_staleness else 1,
    )
    data["pools"]["a"]["rollout_replicas"] = 2
    data["algorithm"]["max_staleness"] = max_staleness
    cfg = parse_config(data)
    sink, killed, stop = Collect(), [], threading.Event()
    services = LocalServices(cfg)
    with services as running:
        thread = threading.Thread(
            target=killer,
            args=(tmp_path / "run" / "services", tmp_path / "run" / "metrics.jsonl", killed, stop),
        )
        thread.start()
        try:
            final = asyncio.run(drive(running, sink))
        finally:
            stop.set()
            thread.join()
    assert killed == VICTIMS
    assert final["state"] == "finished", final
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [e for e in metrics if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))  # each step exactly once
    assert [e["pools"]["a"]["version"] for e in steps] == list(range(1, STEPS + 1))
    for e in steps:  # nothing accepted was lost
        lines = (
            (tmp_path / "run" / "samples" / f"step-{e['step']:06d}.jsonl").read_text().splitlines()
        )
        assert sum(e["pools"]["a"]["agents"].values()) == len(lines) > 0
        # the step's own tasks, each once: none lost or repeated by a kill, a rollback or a resume
        planned = [
            t.task_id for t in step_tasks(cfg.run.seed, e["step"] - 1, cfg.run.tasks_per_step)
        ]
        assert sorted({json.loads(x)["task_id"] for x in lines}) == sorted(planned)
        # drawn from the weights before the step, or up to max_staleness versions before them
        assert all(
            0 <= e["step"] - 1 - json.loads(x)["policy"]["version"] <= max_staleness for x in lines
        )
    assert services.supervisor.restarts == dict.fromkeys(VICTIMS, 1)  # each came back once


def test_a_trainer_killed_between_checkpoints_rolls_back_and_says_so(tiny_model, tmp_path, capsys):
    """kill -9 of the trainer after step 2 of a run with no checkpoint yet (none is written at step
    0 unless asked): the run goes back to the starting weights at step 0 and says so on the console
    (which step, from what, why), records it in metrics.jsonl, and TensorBoard shows each step
    once."""
    from atgrpo.cli.report import Reporter
    from tests.observability.tensorboard_events import shown_scalars

    run_dir = tmp_path / "run"
    cfg = parse_config(toy_config(run_dir, tiny_model, "L1", steps=4, checkpoint_every_steps=100))
    killed, stop = [], threading.Event()

    def kill_the_trainer_after_step_2():
        while not stop.is_set() and 2 not in [
            e["step"] for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "step"
        ]:
            time.sleep(0.1)
        if not stop.is_set():
            svc = next(
                s for s in launcher.read_state(run_dir / "services") if s.name == "trainer-a"
            )
            os.kill(svc.pid, signal.SIGKILL)
            killed.append(svc.name)

    with LocalServices(cfg) as running:
        thread = threading.Thread(target=kill_the_trainer_after_step_2)
        thread.start()
        try:
            final = asyncio.run(drive(running, Reporter(running, mirror=False)))
        finally:
            stop.set()
            thread.join()
    assert killed == ["trainer-a"] and final["state"] == "finished", final
    out = capsys.readouterr().out
    events = read_metrics(run_dir / "metrics.jsonl")
    (back,) = [e for e in events if e["kind"] == "rollback"]
    assert back["to_step"] == 0 and back["from_step"] >= 2 and back["checkpoint"] == "start"
    assert not (run_dir / "checkpoints" / "step-000000").exists()
    line = (
        f"rolled back from step {back['from_step']} to step 0 (the starting weights: no checkpoint "
        f"yet): "
        "trainer 'a' restarted and lost its weights"
    )
    assert line in out
    assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2, 3, 4]  # each step once
    assert [s for s, _ in shown_scalars(run_dir / "tb")["train/reward_mean"]] == [1, 2, 3, 4]

"""Training end to end, stopped and resumed: a run stopped after a step resumes after its last one
in new processes (each step recorded exactly once), and keep_checkpoints prunes the checkpoints
on disk (the last ones and the best by eval success) while the run still resumes from the last."""

from __future__ import annotations

import asyncio
import json

import pytest

from atgrpo.cli.runner import LocalServices
from atgrpo.config import parse_config
from atgrpo.rundir import read_metrics
from tests.e2e.toy_runs import stop_after_step, toy_config, train_locally

pytestmark = pytest.mark.slow


def test_stopped_run_resumes_after_its_last_step(tiny_model, tmp_path):
    data = toy_config(tmp_path / "run", tiny_model, "L1", steps=4)
    cfg = parse_config(data)
    with LocalServices(cfg) as running:
        first = asyncio.run(stop_after_step(running, 2))
    assert first["state"] == "stopped" and first["step"] in (2, 3), first

    # New processes: the trainers load the stop's checkpoint, the router continues after it.
    sink, served = train_locally(data)
    assert sink.status["state"] in ("starting", "running")
    final = [e for e in sink.events if e["kind"] == "status"][-1]
    assert final["resumed_from_step"] == first["step"]
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [e["step"] for e in metrics if e["kind"] == "step"]
    assert steps == [1, 2, 3, 4]  # each step exactly once
    assert [e["pools"]["a"]["version"] for e in metrics if e["kind"] == "step"] == [1, 2, 3, 4]
    assert served == {("a", ""): 4}


def test_keep_checkpoints_prunes_the_disk_and_the_run_still_resumes(tiny_model, tmp_path):
    """keep_checkpoints 2 over 6 checkpoint intervals: the last 2 and the best by eval success stay
    on disk, nothing at step 0; new processes resume from the last and prune on."""
    from atgrpo.rundir import RunDir
    from router_svc.checkpoints import retained

    run_dir = tmp_path / "run"
    data = toy_config(
        run_dir,
        tiny_model,
        "L1",
        steps=6,
        checkpoint_every_steps=1,
        keep_checkpoints=2,
        eval_every_steps=1,
        eval_tasks=2,
        save_samples=False,
        save_eval_samples=True,
    )
    train_locally(data)
    # run.save_eval_samples: every evaluation's samples, the two eval tasks each time, no advantage.
    written = sorted(p.name for p in (run_dir / "eval-samples").iterdir())
    assert written == [f"step-{s:06d}.jsonl" for s in range(7)]
    rows = [json.loads(line) for line in (run_dir / "eval-samples" / "step-000006.jsonl").open()]
    assert len({r["task_id"] for r in rows}) == 2 and {r["advantage"] for r in rows} == {None}
    assert all(r["reward"] == r["local_reward"] and r["response_text"] is not None for r in rows)

    def on_disk() -> list[int]:
        return sorted(
            int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").iterdir()
        )

    evals = {
        e["step"]: e["success_rate"]
        for e in read_metrics(run_dir / "metrics.jsonl")
        if e["kind"] == "eval"
    }
    progress = RunDir(run_dir).read_progress()
    assert [c.success for c in progress.checkpoints] == [
        evals[c.step] for c in progress.checkpoints
    ]
    best = max(range(1, 7), key=lambda s: (evals[s], s))
    assert on_disk() == sorted({5, 6, best}) == [c.step for c in progress.checkpoints]
    assert [c.step for c in retained(progress.checkpoints, 2)] == on_disk()
    assert all(
        sorted(p.name for p in (run_dir / "checkpoints" / f"step-{s:06d}").iterdir()) == ["a"]
        for s in on_disk()
    )

    data["run"]["steps"] = 8  # new processes: the trainer loads step 6
    sink, served = train_locally(data)
    final = [e for e in sink.events if e["kind"] == "status"][-1]
    assert final["resumed_from_step"] == 6 and served == {("a", ""): 8}
    evals = {
        e["step"]: e["success_rate"]
        for e in read_metrics(run_dir / "metrics.jsonl")
        if e["kind"] == "eval"
    }
    best = max(range(1, 9), key=lambda s: (evals[s], s))
    assert on_disk() == sorted({7, 8, best})

"""Asynchronous AT-GRPO end to end (algorithm.max_staleness >= 1; router_svc/pipeline.py): the five
services as real processes, the tiny model, real updates. Collection runs ahead of training, so
samples lag the weights that train them, but never by more than max_staleness, a group never
mixes versions, every step is recorded once with each pool one version further, and evaluations
and checkpoints see every pool at the same step."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import pytest

from atgrpo.cli.runner import LocalServices
from atgrpo.config import parse_config
from atgrpo.rundir import read_metrics
from router_svc.steps import step_tasks
from tests.e2e.toy_runs import stop_after_step, toy_config, train_locally

pytestmark = pytest.mark.slow


def step_samples(run_dir, step: int) -> list[dict]:
    path = run_dir / "samples" / f"step-{step:06d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("level", ["L1", "L3", "L3-mixed"])
def test_collection_runs_ahead_within_the_staleness_bound(level, tiny_model, tmp_path):
    """L3-mixed: pool a (the speaker's) keeps max_staleness 0, pool b (the listener's) 1."""
    run_dir = tmp_path / "run"
    data = toy_config(
        run_dir, tiny_model, level[:2], steps=6, eval_every_steps=3, checkpoint_every_steps=3
    )
    data["algorithm"]["max_staleness"] = 1
    if level == "L3-mixed":
        data["pools"]["a"]["max_staleness"] = 0
    cfg = parse_config(data)
    bound = {p: cfg.max_staleness(p) for p in cfg.pools}
    sink, served = train_locally(data)

    steps = [e for e in sink.events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 7))
    lags = []
    for e in steps:
        for pool, m in e["pools"].items():
            assert m["version"] == e["step"]  # one version per step, every pool
            assert 0 <= m["staleness_max"] <= bound[pool]
            assert m["dropped_stale"] == 0
        groups = defaultdict(set)
        for s in step_samples(run_dir, e["step"]):
            lag = (e["step"] - 1) - s["policy"]["version"]  # the pool trains step s at version s-1
            assert 0 <= lag <= bound[s["pool"]], s
            lags.append(lag)
            groups[(s["task_id"], s["agent"], s["turn"])].add(s["policy"]["version"])
        assert all(len(v) == 1 for v in groups.values())  # a group is one generation: one version
    if level != "L3-mixed":  # there collection waits for pool a's update, and b's is as quick
        assert lags.count(1) > 0, "no sample was drawn ahead of training: nothing overlapped"
    # The pipeline drains at every evaluation and checkpoint: they see each pool at that step.
    assert [e["step"] for e in sink.events if e["kind"] == "eval"] == [0, 3, 6]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["completed_step"] == 6 and state["versions"] == dict.fromkeys(cfg.pools, 6)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-000003",
        "step-000006",
    ]
    assert served == {(p, ""): 6 for p in cfg.pools}
    assert [
        e["step"] for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "step"
    ] == list(range(1, 7))


def test_a_stopped_asynchronous_run_resumes_with_each_step_once(tiny_model, tmp_path):
    """A stop lets the steps already collected train, checkpoints, and new processes go on after
    that step: each step recorded once, one version per step, each step's own tasks."""
    run_dir = tmp_path / "run"
    data = toy_config(run_dir, tiny_model, "L1", steps=6)
    data["algorithm"]["max_staleness"] = 1
    cfg = parse_config(data)

    with LocalServices(cfg) as running:
        first = asyncio.run(stop_after_step(running, 2))
    # the steps collected ahead of training when the stop came are trained, not thrown away
    assert first["state"] == "stopped" and 2 <= first["step"] <= 4, first
    sink, served = train_locally(data)
    assert [e for e in sink.events if e["kind"] == "status"][-1]["resumed_from_step"] == first[
        "step"
    ]
    steps = [e for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 7))
    assert [e["pools"]["a"]["version"] for e in steps] == list(range(1, 7))
    for e in steps:
        planned = [
            t.task_id for t in step_tasks(cfg.run.seed, e["step"] - 1, cfg.run.tasks_per_step)
        ]
        assert sorted({s["task_id"] for s in step_samples(run_dir, e["step"])}) == sorted(planned)
    assert served == {("a", ""): 6}


@pytest.mark.parametrize(("level", "staleness"), [("L1", 0), ("L3", 1)])
def test_an_overlapped_evaluation_runs_beside_the_next_collection_on_its_own_step(
    level, staleness, tiny_model, tmp_path
):
    """run.eval_overlap: step 2's and 4's evaluations run while the next step collects (the step
    after counts the evaluation inside its own seconds, not before them), on step 2's and 4's
    weights only; the last step's is evaluated after it, as without overlap."""
    run_dir = tmp_path / "run"
    data = toy_config(
        run_dir, tiny_model, level, steps=5, eval_every_steps=2, save_eval_samples=True
    )
    data["run"]["eval_overlap"] = True
    data["algorithm"]["max_staleness"] = staleness
    cfg = parse_config(data)
    train_locally(data)

    recorded = read_metrics(run_dir / "metrics.jsonl")
    assert [(e["kind"], e["step"]) for e in recorded] == [("eval", 0)] + [
        x for s in range(1, 6) for x in [("step", s)] + ([("eval", s)] if s in (2, 4, 5) else [])
    ]
    steps = {e["step"]: e for e in recorded if e["kind"] == "step"}
    evals = {e["step"]: e for e in recorded if e["kind"] == "eval"}
    for e in (2, 4):
        after = steps[e + 1]
        assert after["time"] - after["step_seconds"] < evals[e]["time"], (after, evals[e])
        lines = (run_dir / "eval-samples" / f"step-{e:06d}.jsonl").read_text().splitlines()
        versions = {(s["pool"], s["policy"]["version"]) for s in map(json.loads, lines)}
        assert versions == {(p, e) for p in cfg.pools}  # step e's weights, every pool's
    assert all(evals[s]["eval_seconds"] > 0 for s in evals)

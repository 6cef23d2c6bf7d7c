"""bench/real_learning.py at its smoke size: the tiny model, the arithmetic task, AT-GRPO and L0,
two steps each, two eval tasks. It checks the bench's wiring (configs the services accept, a
greedy evaluation at every step with its samples kept, the table, curves and JSON agreeing, a
second call keeping the first call's runs); the real run (SmolLM2, tens of minutes a variant)
writes docs/real_learning/."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def bench(tmp_path, env, *args):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_learning.py"), "--out", str(tmp_path), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc, json.loads((tmp_path / "real_learning.json").read_text())


def test_real_learning_smoke(tiny_model, tmp_path, subprocess_env):
    env = {**subprocess_env, "ATGRPO_BENCH_SMOKE": "1"}
    proc, data = bench(tmp_path, env, "--model", tiny_model)
    assert [(r["task"], r["variant"]) for r in data["runs"]] == [
        ("arithmetic", "at-grpo"),
        ("arithmetic", "L0"),
    ]
    for run in data["runs"]:
        assert [e["step"] for e in run["evals"]] == [0, 1, 2]
        for e in run["evals"]:
            assert 0.0 <= e["success"] <= 1.0 and 0.0 <= e["reasoner_unreadable"] <= 1.0
            # Greedy evaluation of the same two tasks: the samples each evaluation kept say so.
            rows = [
                json.loads(line)
                for line in (
                    tmp_path
                    / "runs"
                    / f"arithmetic-{run['variant']}-bf16"  # the bench's dtype: bfloat16
                    / "eval-samples"
                    / f"step-{e['step']:06d}.jsonl"
                ).open()
            ]
            assert len({r["task_id"] for r in rows}) == 2
        assert run["train_s"] > 0 and len(run["train_reward"]) == 2 and run["dtype"] == "bfloat16"
    at, l0 = data["runs"]
    # 8 tasks x K 4 x two agents, one turn; L0 takes 16 tasks of its one agent: as many samples.
    assert at["samples_per_step"] == l0["samples_per_step"] == 64
    assert "tool_right" in at["evals"][0] and "tool_right" not in l0["evals"][0]
    table = (tmp_path / "real_learning.md").read_text()
    assert (
        f"| arithmetic | L0 | bfloat16 | {l0['evals'][0]['success']:.3f} |" in table
        and table.strip() in proc.stdout
    )
    assert (tmp_path / "real_learning.png").stat().st_size > 10_000

    # A second call for one variant redoes that run and keeps the other. Its training budget is
    # spent by the first step: the run stops there, between evaluations, and the checkpoint of
    # that step is evaluated.
    _, again = bench(
        tmp_path,
        env,
        "--model",
        tiny_model,
        "--variants",
        "L0",
        "--steps",
        "3",
        "--eval-every",
        "10",
        "--minutes",
        "0.0001",
    )
    kept, redone = again["runs"]
    assert (kept["variant"], [e["step"] for e in kept["evals"]]) == ("at-grpo", [0, 1, 2])
    # The stop is asked at step 1's event; the step already in flight may complete too.
    last = len(redone["train_reward"])
    assert (
        redone["variant"] == "L0"
        and last in (1, 2)
        and [e["step"] for e in redone["evals"]] == [0, last]
    )


def test_a_budgeted_run_is_stopped_so_that_its_last_step_ends_within_the_budget():
    sys.path.insert(0, str(ROOT))
    from bench.real_learning import stop_due

    # 100 s steps, 600 s: asked after step 5 (500 s + two more would be 700), step 6 ends at 600
    took = [100.0] * 6
    assert [stop_due(took[:n], 600.0) for n in range(1, 7)] == [False] * 4 + [True] * 2
    # the recent steps foretell: steps that got faster let the run go on
    assert not stop_due([200.0, 50.0, 50.0, 50.0], 600.0) and stop_due([200.0, 200.0, 200.0], 600.0)

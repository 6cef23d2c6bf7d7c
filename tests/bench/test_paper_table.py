"""bench/paper_table.py: its grid, the swap of two roles' policies in a checkpoint, its table,
and at smoke size (the tiny model, one step a cell) a run of L0, L2 and L3 from one warm start
with the swapped evaluations, resumed without running a finished cell again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT))

from bench.paper_table import cells, shown, swapped_checkpoint, table  # noqa: E402


def test_the_main_tasks_team_and_single_agent_cells_get_every_seed():
    assert cells(["arithmetic", "letters"], ["L0", "at-grpo", "L3"], 2) == [
        ("arithmetic", "L0", 0),
        ("arithmetic", "L0", 1),
        ("arithmetic", "at-grpo", 0),
        ("arithmetic", "at-grpo", 1),
        ("arithmetic", "L3", 0),
        ("letters", "L0", 0),
        ("letters", "at-grpo", 0),
        ("letters", "L3", 0),
    ]


def test_a_one_turn_task_runs_no_grouping_that_equals_another_and_the_table_says_which():
    # (task, agent) is (task, agent, turn) and (task, turn) is (task) when an episode is one turn
    grouping = ["by-task", "by-task-agent", "by-task-turn"]
    assert cells(["arithmetic", "plan_path"], grouping, 1) == [
        ("arithmetic", "by-task", 0),
        ("plan_path", "by-task", 0),
        ("plan_path", "by-task-agent", 0),
        ("plan_path", "by-task-turn", 0),
    ]
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in table({}, ["arithmetic", "plan_path"]).splitlines()
    }
    assert rows["group (task, agent)"] == (
        "| group (task, agent) | = AT-GRPO, shared model (L1) (one turn) | not run |"
    )
    assert (
        rows["group (task, turn)"] == "| group (task, turn) | = group (task) (one turn) | not run |"
    )


def test_the_table_keeps_the_columns_of_cells_from_earlier_calls_in_the_tasks_order():
    done = {"letters/L0/s0": {}, "arithmetic3/L3/s0": {}}
    assert shown(done, ["arithmetic"]) == ["arithmetic", "arithmetic3", "letters"]
    assert shown({}, ["plan_path"]) == ["plan_path"]


@pytest.mark.parametrize("variant", ["L3", "L2"])
@pytest.mark.parametrize("team", [("tool", "reasoner"), ("tool", "plan")])
def test_a_swapped_checkpoint_gives_each_role_the_other_s_policy(variant, team, tmp_path):
    # the layouts the trainers write: a folder per pool (L3: a pool per agent), and in an L2
    # pool's model folder an adapter folder per agent
    last = tmp_path / "checkpoints" / "step-000007"
    older = tmp_path / "checkpoints" / "step-000003"
    roles = {r: (last / r if variant == "L3" else last / "shared" / "model" / r) for r in team}
    weights = "model/weights" if variant == "L3" else "weights"
    pools = list(roles.values()) if variant == "L3" else [last / "shared"]
    for role, where in roles.items():
        (where / weights).parent.mkdir(parents=True)
        (where / weights).write_text(f"trained as {role}")
    for pool in pools:
        (pool / "atgrpo.json").write_text(f"pool {pool.name}")
    older.mkdir(parents=True)

    out = swapped_checkpoint(tmp_path, variant, team)
    other = team[1]

    assert out == tmp_path / "swapped" / "step-000007"
    inside = out if variant == "L3" else out / "shared" / "model"
    assert (inside / "tool" / weights).read_text() == f"trained as {other}"
    assert (inside / other / weights).read_text() == "trained as tool"
    # each pool keeps its own record (the trainer checks the pool it names)
    for pool in pools:
        assert (out / pool.name / "atgrpo.json").read_text() == f"pool {pool.name}"
    assert (roles["tool"] / weights).read_text() == "trained as tool"  # the run's own stays


def test_the_table_puts_tasks_across_and_the_paper_s_rows_down():
    def run(task, successes, **extra):
        return {
            "task": task,
            "evals": [{"step": 4 * i, "success": x} for i, x in enumerate(successes)],
            **extra,
        }

    done = {
        "arithmetic/L0/s0": run("arithmetic", [0.1, 0.5, 0.4]),
        "arithmetic/L0/s1": run("arithmetic", [0.1, 0.3, 0.6]),
        "arithmetic/L3/s0": run("arithmetic", [0.2, 0.9], swapped={"step": 4, "success": 0.05}),
    }
    text = table(done, ["arithmetic", "letters"])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert (
        rows["single agent, untrained"] == "| single agent, untrained | 0.100 / 0.100 | not run |"
    )
    assert rows["single agent + GRPO (L0)"] == (
        "| single agent + GRPO (L0) | 0.400 (0.500) / 0.600 (0.600) | not run |"
    )
    assert rows["AT-GRPO, model per role (L3)"].endswith("| 0.900 (0.900) | not run |")
    assert rows["L3, roles swapped"] == "| L3, roles swapped | 0.050 | not run |"
    assert rows["team, untrained"] == "| team, untrained | not run | not run |"


@pytest.mark.slow
def test_paper_table_smoke_runs_a_cell_once(tiny_model, tmp_path, subprocess_env):
    env = {**subprocess_env, "ATGRPO_BENCH_SMOKE": "1"}
    argv = [sys.executable, str(ROOT / "bench" / "paper_table.py"), "--out", str(tmp_path)]
    argv += ["--model", tiny_model, "--variants", "L0,L2,L3", "--warm-start", "all"]

    def bench():
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc, json.loads((tmp_path / "paper_table.json").read_text())["cells"]

    _, done = bench()
    # one warm start for the task, from the env's demonstrations (4 episodes, tool and reasoner
    # each answering right), and every cell trained from it
    warm = json.loads((tmp_path / "paper_table.json").read_text())["warm_starts"]["arithmetic"]
    assert warm["demos"] == {"episodes": 4, "kept": 4, "demos": 8}
    assert warm["sft"]["examples"] == 8 and warm["model"] == str(
        tmp_path / "runs/warm-arithmetic/model"
    )
    assert all(cell["warm_start"] for cell in done.values())
    assert (
        "arithmetic: 8 demonstrations from the 4 of 4" in (tmp_path / "paper_table.md").read_text()
    )
    assert sorted(done) == ["arithmetic/L0/s0", "arithmetic/L2/s0", "arithmetic/L3/s0"]
    for cell in ("arithmetic/L2/s0", "arithmetic/L3/s0"):
        assert [e["step"] for e in done[cell]["evals"]] == [0, 1]
        swapped = done[cell]["swapped"]
        assert swapped["step"] == 1 and 0 <= swapped["success"] <= 1
    assert "swapped" not in done["arithmetic/L0/s0"]
    assert (tmp_path / "paper_table.png").stat().st_size > 10_000
    again, kept = bench()
    assert kept == done and again.stdout.count("done before, kept") == 3


def test_an_unknown_task_or_variant_is_refused_with_the_choices():
    argv = [sys.executable, str(ROOT / "bench" / "paper_table.py"), "--variants", "L0,L9"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown variant(s) ['L9']; choose from ['at-grpo'" in proc.stderr


def test_write_only_runs_nothing_and_shows_every_asked_column(tmp_path, subprocess_env):
    cell = {"task": "arithmetic", "evals": [{"step": 0, "success": 0.25}]}
    kept = {"cells": {"arithmetic/L0/s0": cell}, "warm_starts": {}}
    (tmp_path / "paper_table.json").write_text(json.dumps(kept))
    argv = [sys.executable, str(ROOT / "bench" / "paper_table.py"), "--out", str(tmp_path)]
    argv += ["--write-only", "--tasks", "plan_path,arithmetic"]
    proc = subprocess.run(argv, env=subprocess_env, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "paper_table.json").read_text()) == kept
    head = (tmp_path / "paper_table.md").read_text().splitlines()[0]
    assert head == "| method | arithmetic | plan_path |"  # the tasks' order, not the call's
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

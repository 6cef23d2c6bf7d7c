"""The agent programs of examples/programs/ trained through the real services (router, rollout,
trainer, env and sandbox as local processes) on the tiny model: the runs finish, every call is an
agent turn with K branches, both roles train, the weights move on and evaluation runs."""

import asyncio
import json
from collections import Counter

import yaml

from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import parse_config
from tests.conftest import ROOT
from tests.e2e.toy_runs import Collect

K = 4


def train(example: str, model: str, run_dir, **run) -> tuple[list[dict], list[dict], list[dict]]:
    """examples/programs/<example>, 2 steps of 2 tasks, evaluated (2 tasks) before and after."""
    data = yaml.safe_load((ROOT / "examples" / "programs" / example).read_text())
    data["run"].update(
        steps=2,
        tasks_per_step=2,
        eval_every_steps=2,
        eval_tasks=2,
        run_dir=str(run_dir),
        save_samples=True,
        save_eval_samples=True,
        **run,
    )
    data["pools"]["shared"]["model_path"] = str(model)
    sink = Collect()
    with LocalServices(parse_config(data)) as running:
        final = asyncio.run(drive(running, sink))
    assert final["state"] == "finished", final

    def rows(folder):
        return [
            json.loads(line)
            for f in sorted((run_dir / folder).glob("*.jsonl"))
            for line in f.read_text().splitlines()
        ]

    return sink.events, rows("samples"), rows("eval-samples")


def test_the_arithmetic_team_program_trains_at_l1_on_the_tiny_model(tiny_model, tmp_path):
    events, samples, evals = train("arithmetic_team_L1_tiny.yaml", tiny_model, tmp_path / "run")
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    assert [e["pools"]["shared"]["version"] for e in steps] == [1, 2]  # the weights moved on
    # each call of the program is a turn: one group of K branches per (task, agent, turn)
    groups = Counter((s["episode"], s["task_id"], s["agent"], s["turn"]) for s in samples)
    assert set(groups.values()) == {K}
    assert {(agent, turn) for _, _, agent, turn in groups} == {("tool", 0), ("reasoner", 0)}
    assert len(groups) == 2 * 2 * 2  # 2 steps x 2 tasks x 2 roles
    for group in {g[:2] for g in groups}:
        mine = [s for s in samples if (s["episode"], s["task_id"]) == group]
        for agent in ("tool", "reasoner"):
            assert sorted(s["branch"] for s in mine if s["agent"] == agent) == list(range(K))
    # the built-in env's rewards, through the program: the tiny random model writes no program
    # and no answer (-1), or at best a wrong one (0); the team reward is the reasoner's score
    assert {s["local_reward"] for s in samples} <= {-1.0, 0.0, 1.0}
    assert all(s["team_reward"] in (0.0, 1.0) for s in samples)
    assert {s["policy"]["version"] for s in samples if s["task_id"]} >= {0, 1}
    # evaluation ran before training and after step 2, on the same two eval tasks, both roles
    assert [e["step"] for e in events if e["kind"] == "eval"] == [0, 2]
    assert len({r["task_id"] for r in evals}) == 2
    assert {r["agent"] for r in evals} == {"tool", "reasoner"}


def test_a_program_written_with_the_openai_agents_sdk_trains_two_steps(tiny_model, tmp_path):
    """examples/programs/agents_sdk_pair.py: two Agents SDK agents whose model is an
    OpenAIChatCompletionsModel at task.base_url; each Runner.run is a turn of its role."""
    events, samples, evals = train("agents_sdk_pair_L1_tiny.yaml", tiny_model, tmp_path / "run")
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["pools"]["shared"]["version"] for e in steps] == [1, 2]
    groups = Counter((s["episode"], s["task_id"], s["agent"], s["turn"]) for s in samples)
    assert set(groups.values()) == {K} and len(groups) == 2 * 2 * 2
    assert {(agent, turn) for _, _, agent, turn in groups} == {("solver", 0), ("checker", 0)}
    # the SDK's messages reach the policy as it sent them: the agent's instructions, then the ask
    solver = next(s for s in samples if s["agent"] == "solver")
    assert "You add numbers. Reply with the sum only." in solver["prompt_text"]
    assert "What is " in solver["prompt_text"]
    checker = next(s for s in samples if s["agent"] == "checker")
    assert "The solver says: " in checker["prompt_text"]
    assert {s["local_reward"] for s in samples} <= {0.0, 1.0}
    assert [e["step"] for e in events if e["kind"] == "eval"] == [0, 2]
    assert {r["agent"] for r in evals} == {"solver", "checker"}

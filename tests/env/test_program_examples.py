"""examples/programs/arithmetic_team.py against the built-in `reasoning_gym` env it rewrites: for
the same seeds (train and eval) and the same answers, both give each role the same prompt, the same
local reward and the same team reward, through the real EnvHost and a real bwrap sandbox."""

import asyncio

import pytest
import yaml

from atgrpo.contract.env import EVAL_SEED_OFFSET
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry
from env_svc.envs.reasoning_gym import ReasoningGymEnv
from examples.programs.arithmetic_team import ArithmeticTeam
from tests.conftest import ROOT

BUILT_IN = yaml.safe_load(
    (ROOT / "examples" / "reasoning_gym_arithmetic_L1_smollm2.yaml").read_text()
)

# (the tool's answer, the reasoner's answer) as functions of the task's expression and its value
RIGHT = ("```python\nprint({expr})\n```", "<answer>{value}</answer>")
PLAYS = [
    RIGHT,
    ("```python\nprint({expr} + 1)\n```", "So <answer>{wrong}</answer>"),  # both wrong: 0, 0
    ("I would add them.", "The answer is {value}."),  # no code block: -1; no tagged answer: -1
    ("```python\nraise SystemExit(3)\n```", "\\boxed{{{value}}}"),  # a crash: -1; boxed reads
    ("```python\nx = 1\n```", "<answer>" + "[" * 40 + "1</answer>"),  # 0; too deep to read
    ("```python\nprint('<answer>')\nprint({expr})\nprint('</answer>')\n```", "<answer> </answer>"),
]


def expression(prompt: str) -> str:
    return prompt.split("Calculate ")[1].split(".\n")[0].split("\n")[0].rstrip(".")


async def play(host, env, options, seed, split, tool_text, reasoner_text):
    ep, _ = await host.reset(env, str(seed), seed, split, options)
    (tool_prompt,), _ = await host.observe(ep, "tool")
    expr = expression(tool_prompt["content"])
    value = eval(expr)  # the test's own arithmetic on the dataset's question
    fill = {"expr": expr, "value": value, "wrong": value + 7}
    tool = await host.step(ep, "tool", tool_text.format(**fill))
    (reasoner_prompt,), _ = await host.observe(ep, "reasoner")
    reasoner = await host.step(ep, "reasoner", reasoner_text.format(**fill))
    host.close([ep])
    return {
        "prompts": (tool_prompt["content"], reasoner_prompt["content"]),
        "tool": (tool.team_reward, tool.local_reward),
        "reasoner": (reasoner.team_reward, reasoner.local_reward, reasoner.done, reasoner.success),
    }


def test_the_program_example_plays_exactly_as_the_built_in_env(sandbox):
    registry = Registry(discover=False)
    registry.register(ReasoningGymEnv)
    registry.register(ArithmeticTeam)
    host = EnvHost(registry, sandbox=sandbox)
    built_in = BUILT_IN["env"]["options"]
    seeds = [(3, "train"), (9_999 + 4, "train"), (EVAL_SEED_OFFSET + 5, "eval")]

    async def go():
        got = []
        for (seed, split), (tool_text, reasoner_text) in zip(seeds * 2, PLAYS, strict=True):
            theirs = await play(
                host, "reasoning_gym", built_in, seed, split, tool_text, reasoner_text
            )
            ours = await play(host, "arithmetic_team", None, seed, split, tool_text, reasoner_text)
            assert ours == theirs, (seed, split, tool_text, reasoner_text)
            got.append(ours)
        return got

    got = asyncio.run(go())
    # the rewards the built-in env pays, seen through the program
    assert [(g["tool"][1], g["reasoner"][1:]) for g in got] == [
        (1.0, (1.0, True, True)),
        (0.0, (0.0, True, False)),
        (-1.0, (-1.0, True, False)),
        (-1.0, (1.0, True, True)),
        (0.0, (-1.0, True, False)),
        (1.0, (-1.0, True, False)),
    ]
    assert [g["reasoner"][0] for g in got] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # the team reward
    assert "The tool agent gave no answer: the program printed nothing" in got[4]["prompts"][1]
    assert "Calculate" in got[0]["prompts"][0] and "Turn 1 of 1." in got[0]["prompts"][0]


@pytest.mark.parametrize("split, seed", [("train", 0), ("eval", EVAL_SEED_OFFSET)])
def test_the_program_draws_the_built_in_envs_tasks(split, seed):
    ours, theirs = ArithmeticTeam(), ReasoningGymEnv(BUILT_IN["env"]["options"])
    for s in range(seed, seed + 3):
        ours.reset(str(s), s, split)
        theirs.reset(str(s), s, split)
        assert ours.task[3] == theirs.entry


def test_the_program_evaluates_against_a_rollout_replicas_openai_port(
    tiny_model, sandbox, tmp_path
):
    """docs/environments.md, "Evaluate a program against a running policy": the same program, a
    task of one's own, its client at `python -m rollout_svc --http-port` (a pool per role)."""
    import json
    import os
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from openai import AsyncOpenAI

    from examples.programs.arithmetic_team import arithmetic_team, make_task

    port_file, log = tmp_path / "port.json", tmp_path / "rollout.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATGRPO_")}
    env |= {"PYTHONPATH": str(ROOT), "ATGRPO_LOG_LEVEL": "WARNING"}
    argv = [sys.executable, "-m", "rollout_svc", "--pool", f"tool={tiny_model}"]
    argv += ["--pool", f"reasoner={tiny_model}", "--port", "0", "--http-port", "0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--port-file", str(port_file)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        base_url = f"http://127.0.0.1:{json.loads(port_file.read_text())['http_port']}/v1"
        rewards = []

        async def evaluate(seed):
            client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            task = SimpleNamespace(
                id=str(seed),
                seed=seed,
                split="eval",
                data=make_task(str(seed), seed, "eval"),
                sandbox=sandbox,
                base_url=base_url,
                reward=lambda role, value: rewards.append((role, value)),
            )
            return await arithmetic_team(task, client)

        team = asyncio.run(evaluate(EVAL_SEED_OFFSET))
    finally:
        proc.terminate()
        proc.wait(15)
    # the tiny random model writes no program and no tagged answer: the built-in env's rewards
    assert team == 0.0
    assert [role for role, _ in rewards] == ["tool", "reasoner"]
    assert {value for _, value in rewards} <= {-1.0, 0.0}


def test_the_smollm2_config_is_the_built_in_envs_with_only_the_env_changed():
    from atgrpo.config import parse_config

    ours = yaml.safe_load(
        (ROOT / "examples" / "programs" / "arithmetic_team_L1_smollm2.yaml").read_text()
    )
    assert ours["env"] == {
        "name": "arithmetic_team",
        "path": "examples.programs.arithmetic_team:ArithmeticTeam",
        "max_turns": 1,
        "turn_order": ["tool", "reasoner"],
    }
    assert ours["run"].pop("name") == "program-arithmetic-l1-smollm2"
    theirs = dict(BUILT_IN, run={k: v for k, v in BUILT_IN["run"].items() if k != "name"})
    assert {k: v for k, v in ours.items() if k != "env"} == {
        k: v for k, v in theirs.items() if k != "env"
    }
    parse_config(ours | {"run": {**ours["run"], "name": "x"}})  # a config the router accepts


@pytest.mark.parametrize("target", ["arithmetic_team:ArithmeticTeam", "agents_sdk_pair:AgentsPair"])
def test_the_program_examples_keep_every_rule_of_env_check(target, sandbox):
    """`atgrpo env check` (forks replay the program, sandbox runs included): no rule broken."""
    from atgrpo.sdk.check import check_env

    examples = ["```python\nprint(3 + 4)\n```", "<answer>7</answer>", "The sum is 57"]
    report = check_env(f"examples.programs.{target}", sandbox=sandbox, examples=examples)
    assert report.ok and report.findings == [], report.render()

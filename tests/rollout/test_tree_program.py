"""Agent programs under AT-GRPO's tree sampling: a real env service over gRPC hosting program envs
(tests/env/programs.py), the real tree driver, and a scripted engine (a fake: it answers each
role with chosen texts, so the driver's choices are known)."""

import asyncio
import re

import pytest

from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.rpc.server import create_server
from atgrpo.sdk import intercept
from atgrpo.sdk.client import EnvClient
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry
from atgrpo.sdk.servicer import env_bindings
from rollout_svc.tree import collect
from tests.env import programs
from tests.rollout.scripted import ScriptedEngine


def wrong_then_right(agent, messages, n, i):
    """The tool answers wrong, right, right; the reasoner right, wrong, right (K = 3)."""
    a, b = map(int, re.findall(r"\d", messages[-1]["content"])[:2])
    right, wrong = str(a + b), str(a + b + 1)
    return [wrong, right, right] if agent == "tool" else [right, wrong, right]


def collect_over_grpc(env, engine, tasks=("0",), **kw):
    plan = CollectPlan(
        env=env,
        tasks=tuple(TaskRef(t, i) for i, t in enumerate(tasks)),
        agents={"tool": AgentPlan("tool", "p"), "reasoner": AgentPlan("reasoner", "p")},
        turn_order=("tool", "reasoner"),
        max_turns=kw.pop("max_turns", 2),
        k=3,
        **kw,
    )

    async def go():
        r = Registry(discover=False)
        for cls in (programs.AddAsync, programs.AddSync, programs.LookTwice):
            r.register(cls)
        host = EnvHost(r)
        running = await create_server(env_bindings(host))
        try:
            async with EnvClient(f"127.0.0.1:{running.port}") as envs:
                events = [e async for e in collect(plan, envs, engine)]
        finally:
            await running.stop(0)
        assert len(host.store) == 0  # every branch closed, its program stopped
        return events

    events = asyncio.run(go())
    return [e for e in events if isinstance(e, Sample)], [
        e for e in events if isinstance(e, EpisodeEnd)
    ]


@pytest.mark.parametrize("env", ["add_async", "add_sync"])
def test_a_program_trains_as_an_env_k_branches_per_call_best_goes_on(env):
    routes = len(intercept._the_server().routes)
    engine = ScriptedEngine(wrong_then_right)
    samples, ends = collect_over_grpc(env, engine, tasks=("0", "1", "2"))
    assert [e.error for e in ends] == ["", "", ""] and all(e.success and e.turns == 1 for e in ends)
    for task in ("0", "1", "2"):
        mine = [s for s in samples if s.task_id == task]
        groups = {
            (s.agent, s.turn): [x for x in mine if (x.agent, x.turn) == (s.agent, s.turn)]
            for s in mine
        }
        assert sorted(groups) == [("reasoner", 0), ("tool", 0)]
        for group in groups.values():  # one group: K branches of one prompt
            assert [s.branch for s in group] == [0, 1, 2]
            assert len({tuple(s.prompt_ids) for s in group}) == 1
        tool, reasoner = groups[("tool", 0)], groups[("reasoner", 0)]
        # task.reward paid the tool at its own step; the team reward waits for the return
        assert [(s.team_reward, s.local_reward, s.done) for s in tool] == [
            (0.0, 0.0, False),
            (0.0, 1.0, False),
            (0.0, 1.0, False),
        ]
        assert [s.selected for s in tool] == [False, True, False]  # ties to the lowest index
        assert [(s.team_reward, s.local_reward, s.done) for s in reasoner] == [
            (1.0, 0.5, True),
            (0.0, 0.0, True),
            (1.0, 0.5, True),
        ]
        assert [s.selected for s in reasoner] == [True, False, False]
        assert [s.success for s in reasoner] == [True, False, True]
    # each reasoner's prompt shows the tool's kept answer, on its own task (no call crossed over)
    asked = sorted(m[-1]["content"] for agent, m, _ in engine.calls if agent == "reasoner")
    assert asked == [
        f"What is {a}+{b}? The tool says {a + b}." for a, b in sorted(programs.TASKS["train"])
    ]
    assert {e.task_id: e.agent_rewards for e in ends}["0"] == {"tool": 1.0, "reasoner": 1.5}
    assert len(intercept._the_server().routes) == routes  # no run left registered


def test_a_program_that_calls_the_tool_twice_skips_the_reasoner_in_the_first_turn():
    def script(agent, messages, n, i):
        text = messages[-1]["content"]
        if agent == "tool":  # looks up the digit: wrong, right, right
            x = int(re.search(r"\d", text).group())
            return [str(x + 1), str(x), str(x)]
        return ["3", "4", "3"]  # 1 + 2

    engine = ScriptedEngine(script)
    samples, (end,) = collect_over_grpc("look_twice", engine, max_turns=3)
    assert [(agent, n) for agent, _, n in engine.calls] == [
        ("tool", 3),
        ("tool", 3),
        ("reasoner", 3),
    ]
    assert sorted({(s.agent, s.turn) for s in samples}) == [
        ("reasoner", 1),
        ("tool", 0),
        ("tool", 1),
    ]
    # look_twice pays the tool nothing: its branches tie at 0 and branch 0 (the wrong one) goes on
    assert engine.calls[2][1][-1]["content"] == "Add ['2', '3']."
    reasoner = [s for s in samples if s.agent == "reasoner"]
    assert [(s.team_reward, s.local_reward) for s in reasoner] == [
        (1.0, 0.25),
        (0.0, 0.25),
        (1.0, 0.25),
    ]
    assert (end.turns, end.success) == (2, True)


def test_flat_mode_plays_a_program_once_per_call():
    engine = ScriptedEngine(lambda agent, m, n, i: wrong_then_right(agent, m, 3, i)[2:][:n])
    samples, (end,) = collect_over_grpc("add_sync", engine, mode="flat")
    assert [(s.agent, s.team_reward, s.local_reward) for s in samples] == [
        ("tool", 0.0, 1.0),
        ("reasoner", 1.0, 0.5),
    ]
    assert end.success

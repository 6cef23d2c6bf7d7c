"""The tree driver's rules (DESIGN.md §1), pinned with a scripted engine on an in-process env."""

import asyncio

import pytest

from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.tree import collect, select_branch
from tests.rollout.scripted import PickEnv, ScriptedEngine


def envs():
    r = Registry(discover=False)
    r.register(PickEnv)
    return LocalEnvs(EnvHost(r))


def plan(**kw):
    base = dict(
        env="pick",
        tasks=(TaskRef("t0", 0, episode=1),),
        agents={"a": AgentPlan("a", "p"), "b": AgentPlan("b", "p")},
        turn_order=("a", "b"),
        max_turns=3,
        k=4,
    )
    base.update(kw)
    return CollectPlan(**base)


def run(p, engine, env_api=None):
    async def go():
        return [e async for e in collect(p, env_api or envs(), engine)]

    events = asyncio.run(go())
    return [e for e in events if isinstance(e, Sample)], [
        e for e in events if isinstance(e, EpisodeEnd)
    ]


def test_select_branch():
    assert select_branch([0.1, 0.5, 0.5, 0.2], "best") == 1  # ties go to the lowest index
    assert select_branch([0.1, 0.5], "first") == 0
    assert select_branch([-1.0, -1.0, -1.0], "best") == 0


def test_groups_share_one_prompt_and_the_best_branch_goes_on_before_the_next_agent():
    # a's K=4 candidates are 1,3,2,3 -> branch 1 (3, first of the tie) is kept;
    # b then sees a's kept 3 in its prompt.
    def script(agent, msgs, n, i):
        return ["1", "3", "2", "3"] if agent == "a" else ["4", "4", "4", "4"]

    engine = ScriptedEngine(script)
    samples, ends = run(plan(max_turns=1), engine)
    assert len(samples) == 8 and len(ends) == 1
    for agent in ("a", "b"):
        group = [s for s in samples if s.agent == agent]
        assert [s.branch for s in group] == [0, 1, 2, 3]
        assert len({tuple(s.prompt_ids) for s in group}) == 1
        assert sum(s.selected for s in group) == 1
    a = [s for s in samples if s.agent == "a"]
    assert [s.selected for s in a] == [False, True, False, False]
    assert [s.team_reward for s in a] == [0.1, 0.3, 0.2, 0.3]
    b_prompt = engine.calls[1][1][-1]["content"]
    assert b_prompt == "b sees [('a', 3)]"
    assert all(s.policy.version == 7 and s.logprobs == [-0.5] for s in samples)


def test_selection_first_always_keeps_branch_zero():
    engine = ScriptedEngine(lambda agent, msgs, n, i: ["1", "5", "6", "7"])
    samples, _ = run(plan(max_turns=1, selection="first"), engine)
    assert all(s.selected == (s.branch == 0) for s in samples)
    assert engine.calls[1][1][-1]["content"] == "b sees [('a', 1)]"


def test_episode_stops_at_the_first_done_step():
    # turn 0: a picks 2, b picks 9 on branch 2 -> done; nothing after that.
    script = lambda agent, msgs, n, i: ["2"] * 4 if agent == "a" else ["1", "1", "9", "1"]  # noqa: E731
    samples, (end,) = run(plan(max_turns=3), ScriptedEngine(script))
    assert len(samples) == 8 and end.turns == 1 and end.success
    assert [s.done for s in samples if s.agent == "b"] == [False, False, True, False]
    assert end.agent_rewards == {"a": pytest.approx(0.2), "b": pytest.approx(0.9)}


def test_sample_count_matches_turns_played_and_turns_are_numbered():
    samples, (end,) = run(plan(max_turns=3, k=3), ScriptedEngine(lambda a, m, n, i: ["1"] * n))
    assert end.turns == 3 and not end.success
    assert len(samples) == 3 * 2 * 3
    assert sorted({(s.agent, s.turn) for s in samples}) == [(a, t) for a in "ab" for t in range(3)]


def test_alpha_weights_the_team_reward_in_selection():
    # Local rewards: malformed text gets -1; digits 0. With alpha=0 every digit ties at 0.
    script = lambda agent, msgs, n, i: ["x", "1", "8"] if agent == "a" else ["0"] * n  # noqa: E731
    samples, _ = run(plan(max_turns=1, k=3, alpha=0.0), ScriptedEngine(script))
    assert [s.selected for s in samples if s.agent == "a"] == [False, True, False]
    samples, _ = run(plan(max_turns=1, k=3, alpha=1.0), ScriptedEngine(script))
    assert [s.selected for s in samples if s.agent == "a"] == [False, False, True]


def test_flat_mode_samples_once_per_agent_turn_without_forks():
    engine = ScriptedEngine(lambda a, m, n, i: ["3"] * n)
    samples, (end,) = run(plan(mode="flat", max_turns=2, k=8), engine)
    assert len(samples) == 4 and all(s.selected and s.branch == 0 for s in samples)
    assert all(n == 1 for _, _, n in engine.calls)


def test_parallel_turns_show_every_agent_the_turn_start():
    engine = ScriptedEngine(lambda a, m, n, i: ["3"] * n)
    run(plan(max_turns=2, k=2, parallel=True, env_options={"parallel": True}), engine)
    prompts = [m[-1]["content"] for _, m, _ in engine.calls]
    assert prompts == [
        "a sees []",
        "b sees []",
        "a sees [('a', 3), ('b', 3)]",
        "b sees [('a', 3), ('b', 3)]",
    ]


def test_a_failing_task_contributes_no_samples_and_the_others_go_on():
    tasks = (TaskRef("t0", 0), TaskRef("explode", 1), TaskRef("t2", 2))
    samples, ends = run(
        plan(tasks=tasks, max_turns=1, k=2), ScriptedEngine(lambda a, m, n, i: ["1"] * n)
    )
    assert {s.task_id for s in samples} == {"t0", "t2"}
    bad = next(e for e in ends if e.task_id == "explode")
    assert "this task cannot start" in bad.error and len(ends) == 3


def test_tasks_run_concurrently_within_the_bound_and_episodes_are_closed():
    env_api = envs()
    engine = ScriptedEngine(lambda a, m, n, i: ["1"] * n)
    tasks = tuple(TaskRef(f"t{i % 3}", i, episode=i + 1) for i in range(6))  # each task twice
    samples, _ = run(plan(tasks=tasks, max_turns=2, k=2, max_concurrent_tasks=3), engine, env_api)
    assert 1 < engine.max_in_flight <= 3
    # Concurrent runs interleave; each sample still names the run it came from.
    assert {(s.task_id, s.episode) for s in samples} == {(t.task_id, t.episode) for t in tasks}
    assert len(env_api.host.store) == 0


def test_system_prompt_is_prepended():
    agents = {"a": AgentPlan("a", "p", system_prompt="You are A."), "b": AgentPlan("b", "p")}
    engine = ScriptedEngine(lambda a, m, n, i: ["1"] * n)
    run(plan(agents=agents, max_turns=1, k=1), engine)
    assert engine.calls[0][1][0] == {"role": "system", "content": "You are A."}
    assert engine.calls[1][1][0]["role"] == "user"

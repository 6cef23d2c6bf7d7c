"""Trajectory mode (algorithm.grouping: trajectory): K independent flat episodes per task from one
reset, each turn's sample carrying its copy's return. Pinned with the scripted engine on an
in-process env; expected values are worked out by hand beside each assert."""

import asyncio

import pytest

from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.tree import collect
from router_svc.steps import step_batches
from tests.rollout.scripted import PickEnv, ScriptedEngine


class CountingEnvs(LocalEnvs):
    """LocalEnvs that records resets, forks and closes; steps with the action "boom" fail."""

    def __init__(self, host):
        super().__init__(host)
        self.resets, self.forks, self.closed = 0, [], []

    async def reset(self, *a, **kw):
        self.resets += 1
        return await super().reset(*a, **kw)

    async def fork(self, episode_id, n):
        self.forks.append(n)
        return await super().fork(episode_id, n)

    async def step_many(self, steps):
        if any(action == "boom" for _, _, action in steps):
            raise RuntimeError("the env went away")
        return await super().step_many(steps)

    async def close_episodes(self, episode_ids):
        self.closed += episode_ids
        return await super().close_episodes(episode_ids)


def envs():
    r = Registry(discover=False)
    r.register(PickEnv)
    return CountingEnvs(EnvHost(r))


def plan(**kw):
    base = dict(
        env="pick",
        tasks=(TaskRef("t0", 0, episode=1),),
        agents={"a": AgentPlan("a", "p"), "b": AgentPlan("b", "p")},
        turn_order=("a", "b"),
        max_turns=2,
        k=3,
        mode="trajectory",
        alpha=0.5,
    )
    base.update(kw)
    return CollectPlan(**base)


def run(p, engine, env_api):
    async def go():
        return [e async for e in collect(p, env_api, engine)]

    events = asyncio.run(go())
    return [e for e in events if isinstance(e, Sample)], [
        e for e in events if isinstance(e, EpisodeEnd)
    ]


def scripted(first_moves):
    """a's first move in each copy comes from `first_moves` (in call order), later moves are "x"
    (not a digit: team 0, local -1); b plays "2" on its first turn and "3" on its second."""
    queue = list(first_moves)

    def script(agent, messages, n, i):
        content = messages[-1]["content"]
        if agent == "a":
            return [queue.pop(0) if content == "a sees []" else "x"]
        return ["2" if "('b'" not in content else "3"]

    return ScriptedEngine(script)


def by_copy(samples):
    """copy index -> a's first move in it (identifies the copy whatever the scheduling order)."""
    return {s.branch: s.response_text for s in samples if s.agent == "a" and s.turn == 0}


def test_k_independent_copies_carry_their_returns():
    # alpha 0.5. PickEnv: team = digit/10 (a state value), local 0; "x": team 0, local -1; "9" ends.
    # copy "1": a 1, b 2 | a x, b 3 -> T = 0.3 (last step), L_a = -1, L_b = 0;
    #           R_a = 0.15 - 1 = -0.85, R_b = 0.15; 2 turns, no success.
    # copy "9": a 9 ends it -> T = 0.9, L_a = 0: R_a = 0.45; b never acts (R_b = 0.45, no sample).
    # copy "x": a x, b 2 | a x, b 3 -> T = 0.3, L_a = -2: R_a = 0.15 - 2 = -1.85, R_b = 0.15.
    env_api, engine = envs(), scripted(["1", "9", "x"])
    samples, (end,) = run(plan(tasks=(TaskRef("t0", 0, episode=4),)), engine, env_api)
    copies = by_copy(samples)
    assert sorted(copies) == [0, 1, 2] and sorted(copies.values()) == ["1", "9", "x"]
    assert {s.episode for s in samples} == {4}  # every copy is the task's one run
    expect = {
        "1": (0.3, {"a": -1.0, "b": 0.0}, 4),
        "9": (0.9, {"a": 0.0}, 1),
        "x": (0.3, {"a": -2.0, "b": 0.0}, 4),
    }
    for j, first in copies.items():
        team, local, count = expect[first]
        mine = [s for s in samples if s.branch == j]
        assert len(mine) == count and all(s.selected for s in mine)
        assert all(s.team_reward == team and s.local_reward == local[s.agent] for s in mine)
    # The step's own rewards stay in info: copy "9"'s only sample was a's 9.
    nine = next(s for s in samples if copies[s.branch] == "9")
    assert (nine.info["step_team_reward"], nine.info["step_local_reward"], nine.done) == (
        0.9,
        0.0,
        True,
    )
    # EpisodeEnd: copy 0's success and turns; mean returns a (-0.85 + 0.45 - 1.85) / 3 = -0.75,
    # b (0.15 + 0.45 + 0.15) / 3 = 0.25.
    zero = {"1": (False, 2), "9": (True, 1), "x": (False, 2)}[copies[0]]
    assert (end.success, end.turns) == zero
    assert end.agent_rewards == {"a": pytest.approx(-0.75), "b": pytest.approx(0.25)}
    # One reset, one K-way fork, n=1 generations, copies generating at once, nothing left open.
    assert env_api.resets == 1 and env_api.forks == [3]
    assert all(n == 1 for _, _, n in engine.calls) and engine.max_in_flight == 3
    assert len(env_api.closed) == 4 and len(env_api.host.store) == 0


def test_the_router_mix_is_the_return_and_groups_are_per_agent_over_copies():
    env_api = envs()
    samples, _ = run(plan(), scripted(["1", "9", "x"]), env_api)
    out = step_batches(samples, {"a": "p", "b": "p"}, alpha=0.5, grouping="trajectory")
    ret = {"1": {"a": -0.85, "b": 0.15}, "9": {"a": 0.45}, "x": {"a": -1.85, "b": 0.15}}
    copies = by_copy(samples)
    assert out.rewards == pytest.approx([ret[copies[s.branch]][s.agent] for s in samples])
    # a: returns [-0.85, 0.45, -1.85], one per copy: mean -0.75, dev [-0.1, 1.2, -1.1],
    # SS 2.66, var 1.33, std 1.15325626; A = dev / 1.15325726 = [-0.0867109, 1.0405311, -0.9538201].
    # b: copies "1" and "x" both 0.15 -> a flat group, A = 0.
    adv_a = {"1": -0.08671092, "9": 1.04053106, "x": -0.95382014}
    expected = [adv_a[copies[s.branch]] if s.agent == "a" else 0.0 for s in samples]
    assert out.advantages == pytest.approx(expected, abs=1e-6)
    assert (
        out.agents["a"].groups,
        out.agents["b"].groups,
        out.agents["b"].zero_variance_groups,
    ) == (1, 1, 1)


def test_a_failing_copy_fails_the_task_and_every_copy_is_closed():
    env_api = envs()
    samples, (end,) = run(plan(), scripted(["1", "boom", "x"]), env_api)
    assert samples == [] and "the env went away" in end.error
    assert len(env_api.host.store) == 0


def test_parallel_turns_play_each_copy_as_joint_actions():
    # Both agents act on the turn's start; the turn's outcome (b's 4, applied last) is T = 0.4 for
    # both; alpha 1, locals 0 -> R = 0.4 for each agent in each copy.
    env_api = envs()
    engine = ScriptedEngine(lambda a, m, n, i: ["1" if a == "a" else "4"] * n)
    samples, (end,) = run(
        plan(k=2, max_turns=1, alpha=1.0, parallel=True, env_options={"parallel": True}),
        engine,
        env_api,
    )
    assert sorted((s.branch, s.agent) for s in samples) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert all((s.team_reward, s.local_reward) == (0.4, 0.0) for s in samples)
    assert end.agent_rewards == {"a": pytest.approx(0.4), "b": pytest.approx(0.4)}
    assert env_api.forks == [2] and len(env_api.host.store) == 0

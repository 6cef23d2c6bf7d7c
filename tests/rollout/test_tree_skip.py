"""The skip rule: an env's observe may return no messages to say "this agent does not act now".
The host counts the agent as done for the turn; the driver skips it (no generation, no sample)
in tree, flat and trajectory mode; parallel turns refuse it. Pinned with a scripted fake env
through the real EnvHost and a scripted engine."""

import asyncio

import pytest

from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.errors import EnvCodeError
from atgrpo.sdk import Environment, EnvSpec, StepResult
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.tree import collect
from tests.rollout.scripted import ScriptedEngine


class FakeScriptedTurns(Environment):
    """A fake whose script says who acts next: options["script"], e.g. "aab" (a twice, then b).
    observe shows the agent next in the script its moves so far, and anyone else nothing; the
    episode is done (team reward 1) when the script is played out."""

    name = "fake_turns"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec(
            "fake_turns",
            ("a", "b"),
            ("a", "b"),
            max_turns=self.options.get("max_turns", 4),
            parallel=self.options.get("parallel", False),
        )
        self.script = list(self.options.get("script", "ab"))
        self.moves = []

    def reset(self, task_id, seed, split):
        pass

    def observe(self, agent):
        if not self.script or self.script[0] != agent:
            return []
        return [{"role": "user", "content": f"{agent} after {self.moves}"}]

    def step(self, agent, action):
        assert self.script[0] == agent, "the driver stepped an agent that was skipped"
        self.script.pop(0)
        self.moves.append(action)
        done = not self.script
        return StepResult(1.0 if done else 0.0, int(action) / 10, done=done, success=done)


def host():
    r = Registry(discover=False)
    r.register(FakeScriptedTurns)
    return EnvHost(r)


def run(mode, script, *, k=2, max_turns=4, engine=None):
    engine = engine or ScriptedEngine(lambda agent, msgs, n, i: [str(j + 1) for j in range(n)])
    plan = CollectPlan(
        env="fake_turns",
        tasks=(TaskRef("t0", 0),),
        agents={"a": AgentPlan("a", "p"), "b": AgentPlan("b", "p")},
        turn_order=("a", "b"),
        max_turns=max_turns,
        k=k,
        mode=mode,
        env_options={"script": script, "max_turns": max_turns},
    )
    envs = LocalEnvs(host())

    async def go():
        return [e async for e in collect(plan, envs, engine)]

    events = asyncio.run(go())
    assert len(envs.host.store) == 0  # every state closed
    samples = [e for e in events if isinstance(e, Sample)]
    (end,) = [e for e in events if isinstance(e, EpisodeEnd)]
    return samples, end, engine


def test_the_host_counts_a_skipped_agent_as_done_for_the_turn():
    async def go():
        h = host()
        ep, _ = await h.reset("fake_turns", "t", 0, "train", {"script": "aab"})
        assert (await h.observe(ep, "a")) == ([{"role": "user", "content": "a after []"}], 0)
        assert (await h.step(ep, "a", "1")).turn == 0
        assert await h.observe(ep, "b") == ([], 0)  # b skips turn 0, which is then over
        assert (await h.observe(ep, "a"))[1] == 1
        assert (await h.step(ep, "a", "2")).turn == 1
        last = await h.step(ep, "b", "3")
        assert (last.turn, last.done, last.team_reward) == (1, True, 1.0)

    asyncio.run(go())


def test_tree_mode_skips_the_agent_with_no_generation_and_no_sample():
    samples, end, engine = run("tree", "aab")
    assert [(agent, n) for agent, _, n in engine.calls] == [("a", 2), ("a", 2), ("b", 2)]
    assert [(s.agent, s.turn, s.branch) for s in samples] == [
        ("a", 0, 0), ("a", 0, 1), ("a", 1, 0), ("a", 1, 1), ("b", 1, 0), ("b", 1, 1),
    ]  # fmt: skip
    # The best branch went on: a's second answer (0.2 local) both times; b's prompt shows them.
    assert engine.calls[2][1][-1]["content"] == "b after ['2', '2']"
    assert (end.turns, end.success) == (2, True)
    assert [s.team_reward for s in samples if s.agent == "b"] == [1.0, 1.0]


@pytest.mark.parametrize("mode", ["flat", "trajectory"])
def test_flat_and_trajectory_modes_skip_too(mode):
    samples, end, engine = run(mode, "abb", k=2)
    # turn 0: a, b; turn 1: a skipped, b
    per_copy = [(s.agent, s.turn) for s in samples if s.branch == 0]
    assert per_copy == [("a", 0), ("b", 0), ("b", 1)]
    assert all(n == 1 for _, _, n in engine.calls)
    assert len(engine.calls) == (3 if mode == "flat" else 6) and end.success


def test_a_turn_where_nobody_acts_ends_at_max_turns():
    samples, end, engine = run("tree", "", max_turns=3)  # nobody is ever next
    assert samples == [] and engine.calls == []
    assert (end.turns, end.success, end.error) == (3, False, "")


def test_parallel_turns_refuse_an_empty_observation():
    async def go():
        h = host()
        ep, _ = await h.reset("fake_turns", "t", 0, "train", {"script": "ab", "parallel": True})
        with pytest.raises(EnvCodeError, match="in a parallel turn every agent acts"):
            await h.observe(ep, "b")

    asyncio.run(go())


def test_demonstrations_skip_the_agent_too_and_end_at_max_turns():
    from atgrpo.sdk.demos import play

    h = host()
    solver = lambda agent, messages: "1"  # noqa: E731
    demos, stats = asyncio.run(play(h, "fake_turns", {"script": "aab"}, 1, solver=solver))
    assert [(d.agent, d.turn) for d in demos] == [("a", 0), ("a", 1), ("b", 1)]
    assert (stats.kept, len(h.store)) == (1, 0)
    demos, stats = asyncio.run(play(h, "fake_turns", {"script": ""}, 1, solver=solver))
    assert (demos, stats.kept) == ([], 0)  # nobody ever acts: over after max_turns, no hang

"""Agent programs as environments (atgrpo.sdk.program), driven through the real EnvHost: calls
become turns, rewards arrive at their steps, forks replay, gathered calls are ordered, closed
episodes stop their programs (what a program breaks: test_program_refusals.py)."""

import asyncio
import time

import pytest

from atgrpo.errors import EnvCodeError
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry
from tests.env import programs

ALL = (
    programs.AddAsync,
    programs.AddSync,
    programs.LookTwice,
    programs.Counting,
    programs.Raises,
    programs.ReturnsNan,
    programs.ReturnsText,
    programs.ReturnsTooMuch,
    programs.Stalls,
    programs.Gathers,
    programs.ViaBaseUrl,
    programs.Streams,
    programs.CallsAStranger,
    programs.EveryOtherRun,
    programs.Seeded,
)


def user(text):
    return [{"role": "user", "content": text}]


def on_host(fn):
    async def go():
        r = Registry(discover=False)
        for cls in ALL:
            r.register(cls)
        host = EnvHost(r)
        try:
            return await fn(host)
        finally:
            host.close(list(host.store._episodes))

    return asyncio.run(go())


@pytest.mark.parametrize("env", ["add_async", "add_sync"])
def test_each_call_is_a_turn_with_its_rewards_at_its_own_step(env):
    async def go(host):
        assert host.list_tasks(env, "train") == (["0", "1", "2"], 3)
        ep, spec = await host.reset(env, "1", 0, "train")  # 3 + 4
        assert spec.turn_order == ("tool", "reasoner") and spec.max_turns == 2
        assert await host.observe(ep, "tool") == (user("Compute 3+4."), 0)
        tool = await host.step(ep, "tool", "7")
        assert (tool.team_reward, tool.local_reward, tool.done) == (0.0, 1.0, False)
        assert await host.observe(ep, "reasoner") == (user("What is 3+4? The tool says 7."), 0)
        last = await host.step(ep, "reasoner", "7")
        assert (last.team_reward, last.local_reward, last.done, last.success) == (
            1.0,
            0.5,
            True,
            True,
        )
        assert last.info == {"call": 1} and last.turn == 0

    on_host(go)


@pytest.mark.parametrize("env", ["add_async", "add_sync"])
def test_a_fork_replays_to_its_branch_point_and_goes_on_as_a_fresh_run_would(env):
    async def go(host):
        ep, _ = await host.reset(env, "0", 0, "train")  # 1 + 2
        await host.observe(ep, "tool")
        await host.step(ep, "tool", "4")  # a wrong tool answer: local 0
        live = host.store.get(ep).env._run
        forks = await host.fork(ep, 3)
        holders = [e for e in [ep, *forks] if host.store.get(e).env._run is live]
        assert len(holders) == 1 and holders[0] != ep  # a fork took the paused program over
        fresh, _ = await host.reset(env, "0", 0, "train")
        await host.step(fresh, "tool", "4")
        shown = (user("What is 1+2? The tool says 4."), 0)
        assert [await host.observe(f, "reasoner") for f in forks] == [shown] * 3
        assert await host.observe(fresh, "reasoner") == shown
        results = [
            await host.step(b, "reasoner", a) for b, a in zip([ep, *forks], "3333", strict=True)
        ]
        again = await host.step(fresh, "reasoner", "3")
        # one fork resumed the paused program, the parent and the others replayed it: all as a
        # fresh run would
        assert {(r.team_reward, r.local_reward, r.done) for r in [*results, again]} == {
            (1.0, 0.5, True)
        }
        # a fork's tool answer is replayed, its reward (paid before the fork) not paid again
        t, _ = await host.reset(env, "0", 0, "train")
        branches = await host.fork(t, 2)
        paid = [
            (await host.step(b, "tool", a)).local_reward
            for b, a in zip(branches, "34", strict=True)
        ]
        assert paid == [1.0, 0.0]

    on_host(go)


def test_the_skip_rule_a_program_that_calls_the_tool_twice():
    async def go(host):
        ep, _ = await host.reset("look_twice", "2", 0, "train")  # 2 + 5
        assert await host.observe(ep, "tool") == (user("Look up 2."), 0)
        await host.step(ep, "tool", "2")
        assert await host.observe(ep, "reasoner") == ([], 0)  # skipped: turn 0 is over
        assert await host.observe(ep, "tool") == (user("Look up 5."), 1)
        assert (await host.step(ep, "tool", "5")).turn == 1
        assert await host.observe(ep, "reasoner") == (user("Add ['2', '5']."), 1)
        last = await host.step(ep, "reasoner", "7")
        assert (last.team_reward, last.local_reward, last.done) == (1.0, 0.25, True)

    on_host(go)


def test_calls_made_together_are_served_in_turn_order():
    async def go(host):
        ep, _ = await host.reset("gathers", "0", 0, "train")
        assert await host.observe(ep, "tool") == (user("Compute the sum."), 0)
        await host.step(ep, "tool", "3")
        assert await host.observe(ep, "reasoner") == (user("Guess the sum."), 0)
        last = await host.step(ep, "reasoner", "3")
        assert (last.team_reward, last.done) == (1.0, True)
        (fork,) = await host.fork((await host.reset("gathers", "0", 0, "train"))[0], 1)
        await host.step(fork, "tool", "3")  # a fork replays the same order
        assert (await host.step(fork, "reasoner", "3")).team_reward == 1.0

    on_host(go)


async def _until(done, within_s=5.0):
    """Wait (polling) until done() holds; a loaded machine may take a few loop turns."""
    deadline = time.monotonic() + within_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return done()


def test_closing_an_episode_stops_its_program():
    async def go(host):
        ep, _ = await host.reset("add_async", "0", 0, "train")
        await host.observe(ep, "tool")
        run = host.store.get(ep).env._run
        host.close([ep])
        assert run.closed and await _until(run._job.done)
        assert run._job.cancelled()
        ep, _ = await host.reset("add_sync", "0", 0, "train")
        await host.observe(ep, "tool")
        run = host.store.get(ep).env._run
        host.close([ep])
        assert await _until(run.finished.done)  # the thread's pending call failed: it ended
        value, error = run.finished.result()
        assert value is None and "503" in str(error)
        ep, _ = await host.reset("add_async", "0", 0, "train")  # an abandoned episode expires
        await host.observe(ep, "tool")
        run = host.store.get(ep).env._run
        assert host.store.expire(now=time.monotonic() + host.store.ttl_s + 1) == 1
        assert run.closed and await _until(run._job.done)
        assert run._job.cancelled()

    on_host(go)


def test_a_framework_given_the_base_url_reaches_the_same_run():
    async def go(host):
        ep, _ = await host.reset("via_base_url", "0", 0, "train")
        assert await host.observe(ep, "tool") == (user("Models: ['tool', 'reasoner']."), 0)
        assert (await host.step(ep, "tool", "ok")).team_reward == 1.0

    on_host(go)


@pytest.mark.parametrize("env", ["code_async", "code_sync"])
def test_a_program_runs_the_tools_code_in_the_sandbox(env, sandbox):
    async def go():
        r = Registry(discover=False)
        r.register(programs.CodeAsync)
        r.register(programs.CodeSync)
        host = EnvHost(r, sandbox=sandbox)
        paid = []
        for code in ("print(3 + 4)", "print(8)", "import os; print(os.getuid())"):
            ep, _ = await host.reset(env, "1", 0, "train")  # 3 + 4
            result = await host.step(ep, "tool", code)
            paid.append((result.team_reward, result.local_reward, result.done))
            host.close([ep])
        return paid

    assert asyncio.run(go()) == [(1.0, 1.0, True), (0.0, 0.0, True), (0.0, 0.0, True)]


def test_tasks_from_seeds_and_a_turn_order_option_that_leaves_a_role_out():
    async def go(host):
        assert host.list_tasks("seeded", "train") == ([], -1)  # any id: tasks come from seeds
        a, b = programs.seeded_task("x", 5, "eval")
        ep, _ = await host.reset("seeded", "x", 5, "eval")
        assert await host.observe(ep, "tool") == (user(f"Compute {a}+{b}."), 0)
        # L0: only the reasoner acts; a program that calls the tool cannot run there
        ep, spec = await host.reset("add_async", "0", 0, "train", {"turn_order": ["reasoner"]})
        assert spec.turn_order == ("reasoner",)
        with pytest.raises(EnvCodeError, match=r"called model 'tool': .* one of \['reasoner'\]"):
            await host.observe(ep, "reasoner")

    on_host(go)

"""Agent programs as environments (atgrpo.sdk.program), driven through the real EnvHost: calls
become turns, rewards arrive at their steps, forks replay, and what a program breaks is named."""

import asyncio
import re
import time

import pytest

from atgrpo.errors import EnvCodeError
from atgrpo.sdk.check import check_env
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


async def _the_fork_that_replays(host, episode):
    """Fork `episode` twice and observe both: one takes its paused program over, the other runs
    it again; (that one, its error)."""
    failed = []
    for fork in await host.fork(episode, 2):
        try:
            await host.observe(fork, "reasoner")
        except EnvCodeError as err:
            failed.append((fork, err.message))
    assert len(failed) == 1, failed
    return failed[0]


def test_a_program_that_does_not_replay_is_refused_naming_the_first_differing_call():
    async def go(host):
        ep, _ = await host.reset("counting", "0", 0, "train")
        await host.step(ep, "tool", "3")
        fork, message = await _the_fork_that_replays(host, ep)
        assert (
            "env 'counting' (program tests.env.programs.counting): the program did not replay"
            in message
        )
        assert "call 0 ('tool'): message 0 (user) differs at character 4: recorded 'Run " in message
        assert "draw its random choices from task.rng or task.seed" in message
        with pytest.raises(EnvCodeError, match="did not replay"):  # the error stays
            await host.step(fork, "reasoner", "3")

    on_host(go)


def test_a_replay_that_ends_early_says_so_with_what_the_program_raised():
    async def go(host):
        ep, _ = await host.reset("every_other_run", "0", 0, "train")
        await host.step(ep, "tool", "3")  # the first run
        _, message = await _the_fork_that_replays(host, ep)  # the second run gives up
        assert (
            "did not replay: it ended before call 0 ('tool'), which the first run made "
            "(it raised RuntimeError: gave up)" in message
        )

    on_host(go)


def test_env_check_reports_a_program_that_does_not_replay():
    report = check_env(programs.Counting)
    rules = {f.rule: f.message for f in report.failures}
    assert "did not replay: call 0 ('tool')" in rules["replays"], report.render()
    for cls in (programs.AddAsync, programs.ReasonerFirst, programs.LookTwice):
        good = check_env(cls, examples=["3", "7"], tasks=1)
        assert good.ok and good.findings == [], good.render()


@pytest.mark.parametrize(
    "env, says",
    [
        ("raises", "the program raised KeyError: 'no digits'"),
        (
            "returns_nan",
            "the returned team reward is 'nan': a reward must be a finite number in [-1.0, 1.0]",
        ),
        ("returns_text", "the program returned str '1.0': return the team reward (a float) or"),
        ("returns_2", "the returned team reward is '2.0': a reward must be a finite number in"),
    ],
)
def test_what_a_program_returns_is_checked_and_a_bad_value_is_the_envs_error(env, says):
    async def go(host):
        ep, _ = await host.reset(env, "0", 0, "train")
        for _ in range(2):  # and the episode stays failed
            with pytest.raises(EnvCodeError, match=f"env '{env}' .*{re.escape(says)}"):
                await host.step(ep, "tool", "3")

    on_host(go)


def test_a_program_that_neither_calls_nor_returns_times_out():
    async def go(host):
        ep, _ = await host.reset("stalls", "0", 0, "train")
        start = time.monotonic()
        with pytest.raises(
            EnvCodeError, match=r"neither called the model nor returned within 0.3 s"
        ):
            await host.observe(ep, "tool")
        assert time.monotonic() - start < 2

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


@pytest.mark.parametrize(
    "env, says",
    [
        ("streams", "stream=True: the interception answers whole messages; call without it"),
        (
            "stranger",
            "the program called model 'gpt-4': a call's model names the role that answers",
        ),
    ],
)
def test_a_call_the_interception_cannot_answer_ends_the_episode_saying_why(env, says):
    async def go(host):
        ep, _ = await host.reset(env, "0", 0, "train")
        with pytest.raises(EnvCodeError, match=re.escape(says)):
            await host.observe(ep, "tool")

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

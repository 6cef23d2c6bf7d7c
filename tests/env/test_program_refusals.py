"""What an agent program breaks is named, as the env's error (EnvCodeError), never a reward: a
program that does not replay, raises, returns a bad value, stalls, or makes a call the
interception cannot answer (atgrpo.sdk.program, through the real EnvHost)."""

import re
import time

import pytest

from atgrpo.errors import EnvCodeError
from atgrpo.sdk.check import check_env
from tests.env import programs
from tests.env.test_program_env import on_host


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

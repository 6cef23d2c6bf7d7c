"""Reward integrity of the math env (issue 34), beside tests/env/test_integrity_math.py: in the
environment, an answer the judge refuses (a reasoner's or a tool program's output, hedged or a
megabyte long) is a format failure, never an exception, and the host counts the judge's errors."""

import asyncio
import time

import pytest

from atgrpo.sdk import metrics
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from env_svc.envs import BUILTIN
from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.math import MathEnv
from tests.env.math_judging import (
    MB,
    WALL_S,
    warm,  # noqa: F401 - an autouse fixture
)


def run(coro):
    return asyncio.run(coro)


# ---- the environment: a refusal is a format failure, never an exception --------------------


def make(sandbox=None, **options):
    env = MathEnv(options)
    env.reset("train-half-of-third", 0, "train")  # the answer is 1/6
    env.sandbox = sandbox
    return env


@pytest.mark.parametrize(
    "answer",
    [
        "\\boxed{9^{9^{9^{9}}}}",
        "\\boxed{" + "(" * 5_000 + "1" + ")" * 5_000 + "}",
        "\\boxed{0/0}",
        "\\boxed{" + "1" * 19_000 + "}",
        "\\boxed{\\sqrt{2^{19999}+1}}",
    ],
)
def test_reasoner_refused_answer_is_a_format_failure(answer):
    """Refused after a right answer: the latest answer counts, and a refused one is wrong."""
    env = make(done_when="agree")
    assert run(env.step("reasoner", "\\boxed{1/6}")).success
    t = time.monotonic()
    r = run(env.step("reasoner", f"Let me think.\n{answer}"))
    assert time.monotonic() - t < WALL_S
    assert (r.local_reward, r.team_reward, r.done, r.success) == (FAILURE_REWARD, 0.0, False, False)
    assert r.info["judge_error"] in ("too_large", "too_deep", "undefined") and r.info["parse_error"]
    assert r.info["correct"] is False and len(r.info["answer"]) < 300
    assert env.answer is None and not env.success


def test_reasoner_megabyte_answers():
    env = make()
    for text in (
        "\\boxed{" + "1" * MB + "}",
        "x" * MB,
        "\\boxed{" * (MB // 7),
        "answer" + " " * MB + ": 1/7",
    ):
        t = time.monotonic()
        r = run(env.step("reasoner", text))
        assert time.monotonic() - t < 3 * WALL_S
        assert r.local_reward in (FAILURE_REWARD, 0.0) and not r.success
        assert "parse_error" in r.info or r.info.get("correct") is False


def test_reasoner_hedge_earns_nothing():
    env = make()
    for answer in (
        "\\boxed{\\frac{1}{6}, \\frac{1}{5}}",
        "\\boxed{\\frac16 \\text{ or } \\frac15}",
        "\\boxed{\\pm\\frac{1}{6}}",
        "\\boxed{x = \\frac{1}{5} = \\frac{1}{6}}",
    ):
        r = run(env.step("reasoner", answer))
        assert r.local_reward <= 0.0 and not r.success and not r.done, answer


def test_tool_output_is_bounded(sandbox):
    programs = {
        "tower": "print('9**9**9**9')",
        "long": "print('1' * 5000)",
        "deep": "print('(' * 10000 + '1' + ')' * 10000)",
        "nan": "print(float('nan'))",
        "inf": "print('oo-oo')",
        "huge int": "print(10 ** 100)",
    }
    for name, body in programs.items():
        env = make(sandbox=sandbox)
        r = run(env.step("tool", f"```python\n{body}\n```"))
        assert r.local_reward in (FAILURE_REWARD, 0.0) and not r.info.get("correct"), name
        if r.local_reward == FAILURE_REWARD:
            assert (
                r.info["judge_error"] in ("too_large", "too_deep", "undefined")
                and r.info["parse_error"]
            ), name
            assert env.tool_answer is None
    env = make(sandbox=sandbox, done_when="agree")
    run(env.step("tool", "```python\nprint('9**9**9**9')\n```"))
    r = run(env.step("reasoner", "\\boxed{9**9**9**9}"))
    assert not r.done and r.local_reward == FAILURE_REWARD  # two refused answers never agree


def test_host_counts_judge_errors():
    def count(reason):
        return metrics.JUDGE_ERRORS.labels("math", reason)._value.get()

    async def go():
        envs = LocalEnvs(EnvHost(Registry(BUILTIN, discover=False)))
        ep, _ = await envs.reset(
            "math",
            "train-half-of-third",
            seed=0,
            split="train",
            options={"turn_order": ["reasoner"]},
        )
        before = count("too_large"), count("undefined")
        r = await envs.step(ep, "reasoner", "\\boxed{9^{9^{9^{9}}}}")
        assert r.info["judge_error"] == "too_large" and r.local_reward == FAILURE_REWARD
        r = await envs.step(ep, "reasoner", "\\boxed{0/0}")
        assert r.info["judge_error"] == "undefined"
        assert (count("too_large"), count("undefined")) == (before[0] + 1, before[1] + 1)
        await envs.close_episodes([ep])

    run(go())

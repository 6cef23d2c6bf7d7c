"""The HumanEval judge's rules, pinned without a sandbox: a scripted runner stands in for the
sandboxed calls (named as such: it computes each call in this process, which the real judge never
does), and the data codec round-trips exactly and refuses what is not data."""

import asyncio
import json

import pytest

from atgrpo.sdk.judge import JudgeError
from env_svc.envs import call_data
from env_svc.envs.code_check import FIRST_BATCH, Check, call_outcome, judge

PROMPT = 'def add(x, y):\n    """x + y"""\n'
TEST = (
    """
def check(candidate):
    import random
    assert candidate(1, 2) == 3
    for _ in range(40):
        x, y = random.randint(0, 99), random.randint(0, 99)
        assert candidate(x, y) == x + y
    assert add(2, 2) == 4        # the entry point's own name is the candidate"""
    " (HumanEval/33 does this)\n"
)


def scripted(fn, log):
    """A fake runner: calls `fn` here on each decoded call and records the batch sizes."""

    async def run(keys):
        log.append(len(keys))
        out = []
        for k in keys:
            args, kwargs = call_data.decode(k)
            try:
                out.append(("value", call_data.decode(call_data.dumps(fn(*args, **kwargs)))))
            except TimeoutError:
                out.append(("timeout", "a call ran past the time limit"))
            except Exception as e:  # noqa: BLE001 - the candidate's failure, as data
                out.append(("error", type(e).__name__))
        return out

    return run


def verdict(fn, test=TEST):
    log = []
    v = asyncio.run(judge(Check(PROMPT, test, "add", "humaneval-x"), scripted(fn, log)))
    return v, log


def test_a_right_answer_passes_in_doubling_batches_and_a_wrong_one_after_its_first_batch():
    v, log = verdict(lambda x, y: x + y)
    assert v.passed and v.verdict == "ok" and v.calls == sum(log) <= 42 and sum(log) > 30
    assert log[:2] == [FIRST_BATCH, 2 * FIRST_BATCH] and len(log) == 3
    v, log = verdict(lambda x, y: x - y)
    assert (
        not v.passed and "AssertionError at line 4 of the check" in v.error and log == [FIRST_BATCH]
    )


def test_a_placeholder_never_decides_and_the_random_draws_repeat():
    """Wrong only on the last random pair: every round until the last call is known passes its
    probes, and the verdict still fails; the check's random is seeded by the problem, so two
    judges of one answer make the same calls."""
    seen = []

    def almost(x, y):
        seen.append((x, y))
        return x + y if len(seen) < 41 else -1

    v, _ = verdict(almost)
    assert not v.passed
    first = list(seen)
    seen.clear()
    verdict(almost)
    assert seen == first


def test_a_failed_call_and_a_hang_fail_the_check():
    def boom(x, y):
        raise ValueError

    v, _ = verdict(boom)
    assert not v.passed and "the candidate raised ValueError" in v.error

    def hang(x, y):
        raise TimeoutError

    v, _ = verdict(hang)
    assert (v.passed, v.verdict) == (False, "timeout")


def test_a_check_that_catches_everything_cannot_swallow_a_judge_error():
    test = (
        "def check(candidate):\n    try:\n        candidate(object())\n"
        "    except Exception:\n        pass\n"
    )
    with pytest.raises(JudgeError, match="not plain data"):
        verdict(lambda x: x, test)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        -(2**70),
        1.5,
        float("inf"),
        "é",
        b"\x00\xff",
        [1, [2]],
        (1, (2,)),
        {1: "a", (2, 3): [4]},
        {1, 2},
        frozenset({3}),
        1 + 2j,
        (),
    ],
)
def test_data_round_trips_with_its_exact_type(value):
    back = call_data.decode(call_data.dumps(value))
    assert back == value and type(back) is type(value)


def test_nan_round_trips_and_what_is_not_data_is_refused():
    import math

    assert math.isnan(call_data.decode(call_data.dumps(float("nan"))))

    class Equal:
        def __eq__(self, other):
            return True

    class Int(int):
        pass

    for bad in (Equal(), Int(1), [Equal()], {"k": lambda: 0}, (x for x in ())):
        with pytest.raises(TypeError, match="not plain data"):
            call_data.dumps(bad)
    for text in (
        '{"$eval": "1"}',
        '{"$float": "1e9"}',
        '{"a": 1, "b": 2}',
        "[" * 500 + "]" * 500,
        '{"$set": [[1]]}',
        "not json",
    ):
        with pytest.raises(JudgeError):
            call_data.decode(text)


def test_a_call_s_output_is_read_as_data_only():
    assert call_outcome(None)[0] == "timeout"
    assert call_outcome('{"value": {"$tuple": [1, 2]}}') == ("value", (1, 2))
    assert call_outcome('{"error": "ZeroDivisionError"}') == ("error", "ZeroDivisionError")
    for junk in (
        "",
        "PASSED",
        '{"value": 1, "extra": 2}',
        json.dumps({"value": {"$x": 1}}),
        "[" * 10_000,
    ):
        assert call_outcome(junk)[0] == "error"

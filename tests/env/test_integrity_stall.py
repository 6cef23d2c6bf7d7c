"""No answer stalls the env service: what a HumanEval answer returns is decoded within bounds
(elements, depth, members of a set or dict sharing a hash) and never deep-copied, and check()
runs in a thread, off the event loop, within a time budget.

The attack: ints congruent modulo 2**61 - 1 all hash alike, so a set of 40,000 of them (under
1 MiB, written straight into the harness's result pipe) took CPython tens of seconds to build in
the env service, holding the GIL: every episode and health check of the service waited (24 s on
this machine before the bounds; then twice as long again for the deep copy the judge made)."""

import asyncio
import json
import time

import pytest

from atgrpo.sdk.client import EnvClient
from atgrpo.sdk.judge import JudgeError
from env_svc.envs import call_data
from env_svc.envs.code_check import Check, call_outcome, judge
from tests.env.test_code_check import PROMPT, scripted

P = 2**61 - 1  # hash(k * P) == 0 for every int k
COLLIDING = {
    "set": '{"$set":[' + ",".join(str(k * P) for k in range(1, 40_000)) + "]}",
    "dict": '{"$dict":[' + ",".join(f"[{k * P},0]" for k in range(1, 30_000)) + "]}",
}


def pipe_writer(payload: str) -> str:
    """add(x, y), right but for its first call, whose result it writes into the result pipe
    itself (the harness's child inherits it) instead of returning it."""
    return (
        "```python\nimport os\ndef add(x, y):\n    if (x, y) != (0, 1):\n        return x + y\n"
        f"    data = b'{{\"value\":' + {payload!r}.encode() + b'}}'\n"
        "    for fd in range(3, 64):\n        try:\n            while data:\n"
        "                data = data[os.write(fd, data):]\n            os._exit(0)\n"
        "        except OSError:\n            pass\n```"
    )


@pytest.mark.parametrize(
    "value, reason",
    [
        (COLLIDING["set"], "hash_collisions"),
        (COLLIDING["dict"], "hash_collisions"),
        # tuples of -1 and -2 (hash(-1) == hash(-2)) collide as whole tuples too
        (
            json.dumps(
                {
                    "$frozenset": [
                        {"$tuple": [-1 - (i >> b & 1) for b in range(16)]} for i in range(3000)
                    ]
                }
            ),
            "hash_collisions",
        ),
        ("[" + ",".join(["0"] * 300_000) + "]", "too_large"),
        ("[" * 150 + "]" * 150, "too_deep"),
    ],
)
def test_a_result_too_costly_to_build_is_refused_in_linear_time(value, reason):
    # CPU time, not wall time: the decode runs in this process, and a suite on two busy cores
    # stretched its wall time past 1 s while the CPU it took stayed well under the bound
    start = time.process_time()
    kind, err = call_outcome('{"value":' + value + "}")
    assert (kind, err.reason) == ("refused", reason)
    assert time.process_time() - start < 0.5
    with pytest.raises(JudgeError) as raised:
        call_data.decode(value)
    assert raised.value.reason == reason


def test_honest_data_within_the_bounds_still_decodes():
    value = {frozenset({-1, -2}): [(-1, -2)] * 1000, **{k: {k, -k} for k in range(1000)}}
    assert call_data.decode(call_data.dumps(value)) == value
    big = list(range(call_data.MAX_DATA_ITEMS))
    assert call_data.decode(call_data.dumps(big)) == big


def test_the_check_gets_a_fresh_copy_of_each_result_and_may_mutate_it():
    test = (
        "def check(candidate):\n    r = candidate(1, 2)\n    r.append(9)\n    r[0].add(7)\n"
        "    assert candidate(1, 2) == [{3}]\n"
    )
    v = asyncio.run(judge(Check(PROMPT, test, "add", "x"), scripted(lambda x, y: [{x + y}], [])))
    assert v.passed, v.error


def test_a_check_that_spins_on_a_result_runs_off_the_loop_and_stops_at_its_budget():
    """A check looping over what the answer returned (range(10**18)) is stopped at its budget,
    and the event loop ticks on meanwhile."""
    test = "def check(candidate):\n    for _ in range(candidate(1, 2)):\n        pass\n"
    gaps: list[float] = []

    async def go():
        async def tick():
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.01)
                gaps.append(time.perf_counter() - t)

        ticker = asyncio.create_task(tick())
        try:
            return await judge(
                Check(PROMPT, test, "add", "x"), scripted(lambda x, y: 10**18, []), budget_s=0.5
            )
        finally:
            ticker.cancel()

    start = time.perf_counter()
    with pytest.raises(JudgeError) as err:
        asyncio.run(go())
    assert err.value.reason == "check_timeout" and time.perf_counter() - start < 3
    assert len(gaps) > 10 and max(gaps) < 0.25


@pytest.mark.parametrize("shape", ["set", "dict"])
def test_a_colliding_result_is_refused_at_once_while_health_checks_answer(env_address, shape):
    """The env service and the sandbox service as real processes over gRPC: the step is a format
    failure in under a second, and health checks sent every 20 ms meanwhile all answer at once."""

    async def go():
        async with EnvClient(env_address) as c, EnvClient(env_address) as h:
            ep, _ = await c.reset(
                "code",
                "humaneval-53",
                seed=0,
                split="eval",
                options={"dataset": "humaneval", "turn_order": ["coder"]},
            )
            waits: list[float] = []
            stepping = True

            async def ping():
                while stepping:
                    t = time.perf_counter()
                    assert await h.health(timeout_s=60) == "SERVING"
                    waits.append(time.perf_counter() - t)
                    await asyncio.sleep(0.02)

            pings = asyncio.create_task(ping())
            start = time.perf_counter()
            result = await c.step(ep, "coder", pipe_writer(COLLIDING[shape]))
            took = time.perf_counter() - start
            stepping = False
            await pings
            return result, took, waits

    result, took, waits = asyncio.run(go())
    assert result.info["judge_error"] == "hash_collisions", result.info
    assert result.local_reward == -1.0 and not result.success
    assert took < 1.0 and waits and max(waits) < 0.5, (took, max(waits, default=None))

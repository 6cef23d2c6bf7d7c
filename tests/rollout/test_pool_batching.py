"""How long a pool waits for requests to batch together (rollout_svc.pool.burst_wait): a request
that misses a batch runs one of its own after it, so the pool waits longer when its batches are
long. The engine is `RecordingEngine`, a fake named as such: it records each batch's rows and
answers at once, so only the pool's batching decides what it sees."""

import asyncio

from atgrpo.contract.rollout import Completion
from atgrpo.contract.sampling import Sampling
from rollout_svc.pool import BATCH_GAP_S, BATCH_MAX_WAIT_S, BURST_MAX_S, PoolRuntime, burst_wait


class RecordingEngine:
    def __init__(self):
        self.batches = []  # the samples of each generate call

    def generate(self, prompts, ns, s, adapter=""):
        self.batches.append(sum(ns))
        return [[Completion([1], [-0.5], "a", "stop") for _ in range(n)] for n in ns]


def test_the_wait_grows_with_the_last_batch_between_the_floor_and_the_cap():
    assert burst_wait(0.0) == (BATCH_GAP_S, BATCH_MAX_WAIT_S)  # a fast pool: the fixed floor
    gap, most = burst_wait(10.0)  # 10 s batches: 2% of one
    assert most == 0.2 and gap == 0.02
    assert burst_wait(3600.0) == (BURST_MAX_S / 10, BURST_MAX_S)  # capped however long


def _batches_of_two_requests(last_batch_s: float, apart_s: float) -> list[int]:
    async def go():
        engine = RecordingEngine()
        pool = PoolRuntime(f"burst-{last_batch_s}", engine)
        pool.last_batch_s = last_batch_s
        first = asyncio.create_task(pool.generate("", [5, 6], Sampling(), 4))
        await asyncio.sleep(apart_s)
        second = asyncio.create_task(pool.generate("", [7, 8], Sampling(), 4))
        await asyncio.gather(first, second)
        return engine.batches

    return asyncio.run(go())


def test_after_long_batches_a_request_20_ms_behind_joins_the_batch():
    assert _batches_of_two_requests(last_batch_s=25.0, apart_s=0.02) == [8]


def test_after_short_batches_a_request_that_far_behind_runs_in_a_batch_of_its_own():
    assert _batches_of_two_requests(last_batch_s=0.0, apart_s=0.2) == [4, 4]


def test_the_last_batch_sets_the_next_wait():
    async def go():
        pool = PoolRuntime("burst-measured", RecordingEngine())
        await pool.generate("", [5], Sampling(), 2)
        return pool.last_batch_s

    assert 0.0 < asyncio.run(go()) < 1.0

"""rollout_svc's metrics, read as Prometheus would at scrape time: the pool's and the engine's
gauges follow a generation, and the busy-seconds counter (a replica's busy fraction under rate())
grows by the time spent generating or loading weights, counted up to the scrape while a long
batch runs, and not while idle."""

import asyncio
import threading
import time

import pytest

from atgrpo import errors
from atgrpo.contract.sampling import Sampling
from rollout_svc.pool import PoolRuntime
from tests.rollout.served import GREEDY, HELLO, _perturbed, serve


def test_pool_and_engine_gauges_follow_a_generation(tiny_model):
    """Read as Prometheus would, at scrape time: one request of 4 samples generating, then none."""
    from prometheus_client import REGISTRY

    def gauge(name, **labels):
        return REGISTRY.get_sample_value(name, {"pool": "p", **labels})

    async def go(c, engine):
        assert (
            gauge("atgrpo_rollout_requests_running") == 0
            and gauge("atgrpo_rollout_requests_waiting") == 0
        )
        call = asyncio.ensure_future(
            c.generate(
                "p", messages=HELLO, n=4, sampling=Sampling(temperature=1.0, max_tokens=200, seed=1)
            )
        )
        sequences, waiting = set(), set()
        # the engine generates in a thread: the event loop and a scrape answer
        while not call.done():
            if gauge("atgrpo_rollout_requests_running") == 1:
                # Read at any moment of the batch: its start and end may show the request running
                # while the engine holds no sequence yet, or none any more.
                sequences.add(gauge("atgrpo_rollout_engine_sequences", state="running"))
                waiting.add(gauge("atgrpo_rollout_requests_waiting"))
            await asyncio.sleep(0.005)
        await call
        assert 4 in sequences and sequences <= {0, 4} and waiting == {0}
        assert gauge("atgrpo_rollout_requests_running") == 0
        assert gauge("atgrpo_rollout_engine_sequences", state="running") == 0
        assert gauge("atgrpo_rollout_engine_sequences", state="waiting") == 0
        # the hf engine has no shared cache
        assert gauge("atgrpo_rollout_kv_cache_usage_ratio") is None
        # CPU
        assert (
            REGISTRY.get_sample_value("atgrpo_gpu_memory_allocated_bytes", {"device": "cuda:0"})
            is None
        )

    serve(tiny_model, go)


def test_busy_seconds_count_generations_and_weight_loads_not_idle_time(tiny_model):
    """rate(atgrpo_rollout_busy_seconds_total) is a replica's busy fraction: the counter grows by
    the time the engine generates (or loads weights), never by more than the wall time, and not
    while idle."""
    from prometheus_client import REGISTRY

    def busy():
        return REGISTRY.get_sample_value("atgrpo_rollout_busy_seconds_total", {"pool": "p"})

    def generated():
        return (
            REGISTRY.get_sample_value("atgrpo_rollout_generate_seconds_sum", {"pool": "p"}) or 0.0
        )

    async def go(c, engine):
        idle = busy()
        await asyncio.sleep(0.3)
        assert busy() == idle  # an idle pool's counter does not grow

        before, engine_before = busy(), generated()
        start = time.perf_counter()
        await c.generate(
            "p", messages=HELLO, n=2, sampling=Sampling(temperature=1.0, max_tokens=64, seed=1)
        )
        wall = time.perf_counter() - start
        grown = busy() - before
        # at least the engine's own batch time, at most the request's wall time (the RPC, the
        # batching wait)
        assert 0 < generated() - engine_before <= grown <= wall

        seen = busy()
        await asyncio.sleep(0.3)
        assert busy() == seen  # idle again

        start = time.perf_counter()
        await c.load_weights(_perturbed(engine), "p", 1)  # a weight swap is busy time too
        assert 0 < busy() - seen <= time.perf_counter() - start

    serve(tiny_model, go)


def test_busy_seconds_grow_while_a_long_batch_runs():
    """The batch in progress is counted up to the scrape: a long batch shows as busy while it runs,
    not as a jump at its end (which rate() over a shorter window would read as more than 100%)."""
    from prometheus_client import REGISTRY

    release = threading.Event()

    class Slow:  # generates until released, then fails the request
        def generate(self, prompts, ns, sampling, adapter):
            release.wait(10)
            raise ValueError("released")

    def busy():
        return REGISTRY.get_sample_value("atgrpo_rollout_busy_seconds_total", {"pool": "busy-slow"})

    async def go():
        pool = PoolRuntime("busy-slow", Slow())
        assert busy() == 0
        call = asyncio.ensure_future(pool.generate("", [1, 2, 3], GREEDY, 1))
        await asyncio.sleep(0.3)
        mid = busy()
        await asyncio.sleep(0.2)
        assert 0 < mid < busy()  # still generating: counted up to now
        release.set()
        with pytest.raises(errors.InvalidArgument):
            await call
        done = busy()
        await asyncio.sleep(0.1)
        assert busy() == done >= 0.5  # the whole batch, and nothing since

    asyncio.run(go())

"""Engine errors told apart (rollout_svc.pool.classify): out of memory is retried in smaller pieces
and only a single sample that still does not fit is RESOURCE_EXHAUSTED; a bad request stays
INVALID_ARGUMENT (for the request at fault alone); any other engine failure is UNAVAILABLE.

The engine is the real tiny model behind `FlakyEngine`, a fake named as such: it raises the
error under test when a batch asks for more samples than it allows, else generates for real."""

import asyncio

import grpc
import pytest
import torch
from grpc import aio
from prometheus_client import REGISTRY

from atgrpo import errors
from atgrpo._proto.v1 import rollout_pb2
from atgrpo.contract import rollout_wire
from atgrpo.contract.rollout import EpisodeEnd, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.rpc.server import create_server
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.client import RolloutClient
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import BAD_REQUEST, ENGINE_FAILURE, OUT_OF_MEMORY, PoolRuntime, classify
from rollout_svc.replica import Replica
from rollout_svc.server import bindings
from tests.rollout.scripted import PickEnv, pick_plan

GREEDY = Sampling(temperature=0.0, max_tokens=6)


def oom():
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class FlakyEngine:
    """The real engine, whose generate raises `error()` first when a batch asks for more than
    `max_rows` samples (0: every batch), or when `bad(prompt)` holds for one of its prompts."""

    def __init__(self, engine, error=None, max_rows=0, bad=None):
        self.engine, self.error, self.max_rows, self.bad = engine, error, max_rows, bad
        self.calls = []  # (ns, seed) of every generate

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, ns, s, adapter=""):
        self.calls.append((list(ns), s.seed))
        if self.bad is not None and any(self.bad(p) for p in prompts):
            raise ValueError("token 7 cannot start a prompt")
        if self.error is not None and sum(ns) > self.max_rows:
            raise self.error()
        return self.engine.generate(prompts, ns, s, adapter)


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFEngine(tiny_model, device="cpu", dtype="float32")


def prompts(engine, count):
    return [
        engine.render([{"role": "user", "content": f"Question {i}: where is the goal?"}], 0)[0]
        for i in range(count)
    ]


def retries_metric(pool):
    return REGISTRY.get_sample_value("atgrpo_rollout_oom_retries_total", {"pool": pool}) or 0.0


def run_pool(flaky, name, requests):
    """Generate `requests` ((prompt, n, sampling)) at once on a fresh pool: one batch."""

    async def go():
        pool = PoolRuntime(name, flaky)
        outs = await asyncio.gather(
            *(pool.generate("", p, s, n) for p, n, s in requests), return_exceptions=True
        )
        return pool, outs

    return asyncio.run(go())


def test_the_rule_tells_the_three_kinds_apart():
    assert (
        classify(oom())
        == classify(torch.cuda.OutOfMemoryError("x"))
        == classify(MemoryError())
        == OUT_OF_MEMORY
    )
    assert classify(RuntimeError("CUDA error: out of memory")) == OUT_OF_MEMORY
    assert (
        classify(
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                "allocate memory: you tried to allocate 100000000000000 bytes."
            )
        )
        == OUT_OF_MEMORY
    )
    for err in (
        ValueError("x"),
        TypeError("x"),
        IndexError("x"),
        KeyError("planner"),
        NotImplementedError("x"),
    ):
        assert classify(err) == BAD_REQUEST
    for err in (
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        OSError("x"),
        ZeroDivisionError("x"),
        Exception("EngineCore encountered an issue"),
    ):
        assert classify(err) == ENGINE_FAILURE

    class EngineDead(Exception):
        pass

    class Own:
        oom_errors = (EngineDead,)
        bad_request_errors = (LookupError,)

    assert (
        classify(EngineDead(), Own()) == OUT_OF_MEMORY
        and classify(LookupError(), Own()) == BAD_REQUEST
    )


def test_a_batch_that_runs_out_of_memory_is_run_again_in_halves(engine):
    """4 requests, an engine that runs out of memory above 1 row: 7 engine calls, 3 retries, and
    every request gets the completion it gets alone."""
    flaky = FlakyEngine(engine, oom, max_rows=1)
    ps = prompts(engine, 4)
    before = retries_metric("halves")
    pool, outs = run_pool(flaky, "halves", [(p, 1, GREEDY) for p in ps])
    assert [ns for ns, _ in flaky.calls] == [[1, 1, 1, 1], [1, 1], [1], [1], [1, 1], [1], [1]]
    assert pool.oom_retries == 3 and retries_metric("halves") - before == 3
    for p, gen in zip(ps, outs, strict=True):
        assert gen.prompt_ids == p and gen.policy.version == 0 and len(gen.completions) == 1
        alone = engine.generate([p], [1], GREEDY)[0][0]
        assert (
            gen.completions[0].token_ids == alone.token_ids
            and gen.completions[0].logprobs == alone.logprobs
        )


def test_one_request_is_split_into_shares_of_its_samples_each_with_its_own_seed(engine):
    """n=3 with seed 7, an engine that runs out of memory above 1 row: shares 1 + (1 + 1), seeded
    7, 8, 9 (the same seed twice would draw the same sample twice), joined in order."""
    flaky = FlakyEngine(engine, oom, max_rows=1)
    s = Sampling(temperature=1.0, max_tokens=8, seed=7)
    (p,) = prompts(engine, 1)
    pool, (gen,) = run_pool(flaky, "shares", [(p, 3, s)])
    assert flaky.calls == [([3], 7), ([1], 7), ([2], 8), ([1], 8), ([1], 9)]
    assert pool.oom_retries == 2 and len(gen.completions) == 3
    assert len({tuple(c.token_ids) for c in gen.completions}) == 3
    for seed, c in zip((7, 8, 9), gen.completions, strict=True):
        assert (
            c.token_ids
            == engine.generate([p], [1], Sampling(temperature=1.0, max_tokens=8, seed=seed))[0][
                0
            ].token_ids
        )


def test_a_single_sample_that_still_does_not_fit_is_resource_exhausted(engine):
    """Always out of memory, 2 requests of n=2: 3 splits, down to one sample of each, then
    RESOURCE_EXHAUSTED naming what to lower; the second share of a failed request is not tried."""
    flaky = FlakyEngine(engine, oom)
    ps = prompts(engine, 2)
    pool, outs = run_pool(flaky, "exhausted", [(p, 2, GREEDY) for p in ps])
    assert [ns for ns, _ in flaky.calls] == [[2, 2], [2], [1], [2], [1]]
    assert pool.oom_retries == 3
    assert all(isinstance(e, errors.ResourceExhausted) and e.retryable for e in outs)
    assert outs[0] is not outs[1]
    for what in (
        "out of memory",
        "Retryable",
        "max_tokens",
        "k (samples per prompt)",
        "max_prompt_tokens",
        f"{len(ps[0])}-token prompt",
    ):
        assert what in outs[0].message
    assert errors.ResourceExhausted.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_bad_request_fails_alone_and_an_engine_failure_fails_the_batch(engine):
    ps = prompts(engine, 3)
    bad = [7] + ps[1]
    flaky = FlakyEngine(engine, bad=lambda p: p[0] == 7)
    pool, outs = run_pool(flaky, "bad", [(ps[0], 1, GREEDY), (bad, 1, GREEDY), (ps[2], 1, GREEDY)])
    # Bisected: [3] -> [1] ok, [2] -> [1] bad, [1] ok. Not an out-of-memory retry.
    assert [ns for ns, _ in flaky.calls] == [
        [1, 1, 1],
        [1],
        [1, 1],
        [1],
        [1],
    ] and pool.oom_retries == 0
    assert (
        isinstance(outs[1], errors.InvalidArgument)
        and "token 7 cannot start a prompt" in outs[1].message
    )
    assert [len(o.completions) for o in (outs[0], outs[2])] == [1, 1]

    def dead():
        return RuntimeError("CUDA error: an illegal memory access was encountered")

    flaky = FlakyEngine(engine, dead)
    pool, outs = run_pool(flaky, "dead", [(p, 2, GREEDY) for p in ps])
    assert [ns for ns, _ in flaky.calls] == [[2, 2, 2]] and pool.oom_retries == 0  # no retry here
    assert all(isinstance(e, errors.Unavailable) for e in outs)
    assert outs[0].message == (
        "the engine of pool 'dead' failed: RuntimeError: CUDA error: an illegal memory "
        "access was encountered; retry, possibly on another replica"
    )


def serve(flaky, fn):
    async def go():
        replica = Replica({"p": PoolRuntime("p", flaky)})
        registry = Registry(discover=False)
        registry.register(PickEnv)
        running = await create_server(bindings(replica, LocalEnvs(EnvHost(registry))))
        try:
            async with RolloutClient(f"127.0.0.1:{running.port}") as c:
                return await fn(c, replica.pools["p"])
        finally:
            await running.stop(0)

    return asyncio.run(go())


def test_the_codes_over_grpc(engine):
    """Through the real servicer, raw statuses (no client retries): out of memory even alone is
    RESOURCE_EXHAUSTED, an engine failure UNAVAILABLE, a bad request INVALID_ARGUMENT."""
    flaky = FlakyEngine(engine)

    async def go(c, pool):
        req = rollout_pb2.GenerateRequest(
            pool="p", n=2, sampling=rollout_wire.sampling_to_pb(GREEDY)
        )
        req.prompt_token_ids.ids.extend(prompts(engine, 1)[0])
        codes = []
        for error, bad in (
            (oom, None),
            (lambda: RuntimeError("engine dead"), None),
            (None, lambda p: True),
        ):
            flaky.error, flaky.bad = error, bad
            with pytest.raises(aio.AioRpcError) as failed:
                await c.stub.Generate(req)
            codes.append(failed.value.code())
        assert codes == [
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.INVALID_ARGUMENT,
        ]
        flaky.error, flaky.bad, flaky.max_rows = oom, None, 1
        gen = rollout_wire.generation_from_pb(await c.stub.Generate(req))
        # the first case split n=2 once too
        assert len(gen.completions) == 2 and pool.oom_retries == 1 + 1

    serve(flaky, go)


def test_collect_goes_on_through_out_of_memory_and_ends_retryably_when_nothing_fits(engine):
    """A tree Collect (2 tasks, k=3) on an engine that runs out of memory above 2 rows: every
    episode ends without error. Always out of memory: each episode ends with a ResourceExhausted
    error, which the router retries (only InvalidArgument and EnvCodeError episode errors fail a
    run)."""

    flaky = FlakyEngine(engine, oom, max_rows=2)

    async def go(c, pool):
        events = [e async for e in c.collect(pick_plan())]
        ends = [e for e in events if isinstance(e, EpisodeEnd)]
        samples = [e for e in events if isinstance(e, Sample)]
        assert len(ends) == 2 and not any(e.error for e in ends)
        assert len(samples) == sum(e.turns for e in ends) * 2 * 3 and pool.oom_retries > 0
        flaky.max_rows = 0
        ends = [e for e in [e async for e in c.collect(pick_plan())] if isinstance(e, EpisodeEnd)]
        assert len(ends) == 2 and all(
            e.error.startswith("ResourceExhausted: pool 'p' ran out of memory") for e in ends
        )

    serve(flaky, go)

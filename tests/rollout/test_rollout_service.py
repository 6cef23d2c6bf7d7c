"""rollout_svc with the tiny model over real gRPC: log-probs, weight swaps, adapters, Collect."""

import asyncio
import dataclasses
import json
import threading
import time

import grpc
import pytest
import torch
from grpc import aio

from atgrpo import errors
from atgrpo._proto.v1 import rollout_pb2
from atgrpo.algo.sampling import transform_logits
from atgrpo.contract import rollout_wire
from atgrpo.contract import weight_payload as weights
from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, PolicyRef, Sample, TaskRef
from atgrpo.contract.sampling import Sampling
from atgrpo.rpc.server import create_server
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.client import RolloutClient, push_weights
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings
from tests.rollout.scripted import PickEnv

GREEDY = Sampling(temperature=0.0, max_tokens=12)
HELLO = [{"role": "user", "content": "Say something about grids."}]


def serve(model_dir, fn, *, lora=False, dtype="float32", continuous=True):
    async def go():
        engine = HFEngine(model_dir, device="cpu", dtype=dtype, continuous=continuous)
        replica = Replica({"p": PoolRuntime("p", engine, lora=lora)})
        registry = Registry(discover=False)
        registry.register(PickEnv)
        running = await create_server(bindings(replica, LocalEnvs(EnvHost(registry))))
        try:
            async with RolloutClient(f"127.0.0.1:{running.port}") as c:
                return await fn(c, engine)
        finally:
            await running.stop(0)

    return asyncio.run(go())


def forward_logprobs(engine, prompt, response, s):
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + response])).logits[0]  # (T, V)
    lp = torch.log_softmax(transform_logits(logits[len(prompt) - 1 : -1].float(), s), dim=-1)
    return lp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_logprobs_equal_a_separate_forward_pass_under_the_same_transform(tiny_model):
    s = Sampling(temperature=0.8, top_p=0.9, top_k=20, max_tokens=16, seed=3)

    async def go(c, engine):
        gen = await c.generate("p", messages=HELLO, sampling=s, n=4)
        assert len(gen.completions) == 4 and gen.policy.version == 0
        for comp in gen.completions:
            assert len(comp.logprobs) == len(comp.token_ids) > 0
            ref = forward_logprobs(engine, gen.prompt_ids, comp.token_ids, s)
            assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)
        # Sampled tokens are inside the transform's support: top-k never lets a -inf token through.
        assert all(lp > float("-inf") for comp in gen.completions for lp in comp.logprobs)

    serve(tiny_model, go)


def test_stop_strings_and_max_tokens(tiny_model):
    async def go(c, engine):
        free = await c.generate(
            "p", messages=HELLO, sampling=Sampling(temperature=0.0, max_tokens=20)
        )
        text = free.completions[0].text
        assert (
            free.completions[0].finish_reason == "length"
            and len(free.completions[0].token_ids) == 20
        )
        stop = text[len(text) // 2 : len(text) // 2 + 2]
        cut = await c.generate(
            "p", messages=HELLO, sampling=Sampling(temperature=0.0, max_tokens=20, stop=(stop,))
        )
        assert cut.completions[0].finish_reason == "stop"
        assert cut.completions[0].text == text[: text.find(stop)]
        longp = await c.generate(
            "p",
            prompt_ids=list(range(5, 105)),
            sampling=Sampling(max_tokens=2, max_prompt_tokens=30),
        )
        assert longp.prompt_truncated and longp.prompt_ids == list(range(75, 105))

    serve(tiny_model, go)


def _perturbed(engine, scale=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + scale * torch.randn(v.shape, generator=g)
        for k, v in engine.model.state_dict().items()
    }


def test_a_weight_swap_changes_outputs_and_version_and_bad_pushes_change_nothing(tiny_model):
    async def go(c, engine):
        before = (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].token_ids
        state = _perturbed(engine)
        chunks = weights.encode(state, "p", 1, chunk_bytes=1 << 16)
        assert len(chunks) > 3
        bad_sum = [
            rollout_pb2.WeightChunk(
                header=rollout_pb2.WeightHeader(**{**_header_dict(chunks[0]), "digest": "0" * 32})
            ),
            *chunks[1:],
        ]
        for stream, error, msg in [
            (chunks[:-1], errors.InvalidArgument, "truncated"),
            (bad_sum, errors.InvalidArgument, "checksum mismatch"),
            (chunks[1:], errors.InvalidArgument, "must start with a header"),
            (weights.encode(state, "nope", 1), errors.NotFound, "no pool 'nope'"),
            (weights.encode({"x": torch.zeros(2)}, "p", 1), errors.InvalidArgument, "do not fit"),
        ]:
            with pytest.raises(error, match=msg):
                await c._call(c.stub.LoadWeights, iter(stream))
        assert (await c.policies())[0].version == 0
        assert (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[
            0
        ].token_ids == before
        resp = await c.load_weights(state, "p", 1)
        assert resp.policy.version == 1 and resp.bytes_received > 0
        after = await c.generate("p", messages=HELLO, sampling=GREEDY)
        assert after.policy.version == 1 and after.completions[0].token_ids != before
        with pytest.raises(errors.FailedPrecondition, match="stale"):
            await c.load_weights(state, "p", 1)
        with pytest.raises(errors.FailedPrecondition, match="version 1 here, not version 0"):
            await c.generate("p", messages=HELLO, sampling=GREEDY, expected_version=0)

    serve(tiny_model, go)


def test_a_push_is_cast_to_the_dtype_the_replica_serves_and_streams_with_a_trailer(tiny_model):
    """A float32 master pushed to a bfloat16 engine travels as bfloat16: half the bytes, and the
    engine serves exactly the cast weights."""

    async def go(c, engine):
        assert (await c.weight_dtypes()) == {"p": "bfloat16"}
        state = {k: v.float() for k, v in _perturbed(engine).items()}
        if engine.model.config.tie_word_embeddings:  # tied, as a trainer's state is
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        fp32_bytes = sum(v.numel() * 4 for v in state.values())
        sent = await push_weights([c.address], [("", state, None)], "p", 1)
        assert sent < 0.55 * fp32_bytes
        served = engine.model.state_dict()
        assert all(torch.equal(served[k], v.bfloat16()) for k, v in state.items())
        assert (await c.policies())[0].version == 1

    serve(tiny_model, go, dtype="bfloat16")


def test_a_cpu_engine_adopts_the_pushed_tensors_instead_of_copying_them_in(tiny_model):
    """The received buffer becomes the weights (one pass less over the push's bytes) and the old
    ones are dropped; a tied head stays one tensor with the embeddings."""

    async def go(c, engine):
        before = {k: v.data_ptr() for k, v in engine.model.state_dict().items()}
        state = _perturbed(engine)
        tied = engine.model.config.tie_word_embeddings
        if tied:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        await c.load_weights(state, "p", 1)
        served = engine.model.state_dict()
        assert all(torch.equal(served[k], v) for k, v in state.items())
        assert all(served[k].data_ptr() != before[k] for k in served)
        assert (
            served["lm_head.weight"].data_ptr() == served["model.embed_tokens.weight"].data_ptr()
        ) == tied

    serve(tiny_model, go)


def _header_dict(chunk):
    h = chunk.header
    return {f.name: getattr(h, f.name) for f in h.DESCRIPTOR.fields}


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "fixed"])
def test_generations_during_a_swap_never_mix_versions(tiny_model, monkeypatch, continuous):
    """A swap waits for the requests taken before it (a fixed batch, or the requests in the
    continuous batch); those behind it run on the new weights."""
    from rollout_svc.engines.hf_batch import ContinuousBatch

    async def go(c, engine):
        v0 = (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].token_ids
        state = _perturbed(engine, seed=1)
        generating = threading.Event()
        owner, name = (ContinuousBatch, "step") if continuous else (engine, "generate")
        generate = getattr(owner, name)

        def observed(*args):
            generating.set()
            return generate(*args)

        monkeypatch.setattr(owner, name, observed)
        gens = [
            asyncio.create_task(c.generate("p", messages=HELLO, sampling=GREEDY)) for _ in range(12)
        ]
        assert await asyncio.to_thread(generating.wait, 60)  # the push comes while a batch runs
        push = asyncio.create_task(c.load_weights(state, "p", 1))
        gens += [
            asyncio.create_task(c.generate("p", messages=HELLO, sampling=GREEDY)) for _ in range(12)
        ]
        await push
        v1 = (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].token_ids
        assert v0 != v1
        results = await asyncio.gather(*gens)
        for g in results:
            assert g.completions[0].token_ids == (v0 if g.policy.version == 0 else v1)
        assert 0 in {g.policy.version for g in results} <= {0, 1}

    serve(tiny_model, go, continuous=continuous)


def _adapter(model_dir, seed):
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)
    state = get_peft_model_state_dict(model)
    return {k: v * 5 for k, v in state.items()}, json.loads(json.dumps(cfg.to_dict(), default=list))


def test_per_agent_adapters_are_served_with_their_own_versions(tiny_model):
    async def go(c, engine):
        base = (await c.generate("p", messages=HELLO, sampling=GREEDY)).completions[0].token_ids
        with pytest.raises(errors.NotFound, match="no adapter 'planner'"):
            await c.generate("p", adapter="planner", messages=HELLO, sampling=GREEDY)
        with pytest.raises(errors.InvalidArgument, match="LoRA-specialised"):
            await c.load_weights(engine.model.state_dict(), "p", 1)
        for i, name in enumerate(("planner", "tool")):
            state, cfg = _adapter(tiny_model, seed=i)
            await c.load_weights(state, "p", 1, adapter=name, adapter_config=cfg)
        state, cfg = _adapter(tiny_model, seed=7)
        await c.load_weights(state, "p", 2, adapter="tool", adapter_config=cfg)
        versions = {(p.adapter, p.version) for p in await c.policies()}
        assert versions == {("", 0), ("planner", 1), ("tool", 2)}
        planner = await c.generate("p", adapter="planner", messages=HELLO, sampling=GREEDY)
        tool = await c.generate("p", adapter="tool", messages=HELLO, sampling=GREEDY)
        again = await c.generate("p", messages=HELLO, sampling=GREEDY)
        assert planner.policy.version == 1 and tool.policy.version == 2
        assert (
            len(
                {
                    tuple(base),
                    tuple(planner.completions[0].token_ids),
                    tuple(tool.completions[0].token_ids),
                }
            )
            == 3
        )
        assert again.completions[0].token_ids == base  # the bare base is untouched by adapters

    serve(tiny_model, go, lora=True)


def test_collect_streams_groups_with_the_real_model(tiny_model):
    def plan(**kw):
        agents = {
            n: AgentPlan(n, "p", sampling=Sampling(temperature=1.0, max_tokens=4))
            for n in ("a", "b")
        }
        fields = dict(
            run_id="r",
            step=3,
            env="pick",
            turn_order=("a", "b"),
            max_turns=2,
            k=3,
            alpha=1.0,
            tasks=tuple(TaskRef(f"t{i}", i, episode=i + 1) for i in range(2)),
            agents=agents,
        )
        return CollectPlan(**{**fields, **kw})

    async def go(c, engine):
        raw = [e async for e in c.stub.Collect(rollout_wire.collect_plan_to_pb(plan()))]
        assert all(
            e.sample.run_id == "r" and e.sample.step == 3
            for e in raw
            if e.WhichOneof("event") == "sample"
        )
        events = [rollout_wire.event_from_pb(e) for e in raw]
        samples = [e for e in events if isinstance(e, Sample)]
        ends = [e for e in events if isinstance(e, EpisodeEnd)]
        assert len(ends) == 2 and all(not e.error for e in ends)
        assert len(samples) == sum(e.turns for e in ends) * 2 * 3
        groups = {}
        for s in samples:
            groups.setdefault((s.task_id, s.agent, s.turn), []).append(s)
        for group in groups.values():
            assert sorted(s.branch for s in group) == [0, 1, 2]
            assert len({tuple(s.prompt_ids) for s in group}) == 1
            assert sum(s.selected for s in group) == 1
            assert all(len(s.logprobs) == len(s.response_ids) for s in group)
            assert all(s.sampling.temperature == 1.0 for s in group)
        stale = rollout_wire.collect_plan_to_pb(plan())
        stale.expected_versions.append(rollout_wire.policy_to_pb(PolicyRef("p", "", 5)))
        with pytest.raises(aio.AioRpcError) as refused:
            [e async for e in c.stub.Collect(stale)]
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "p is at version 0 here, not version 5" in refused.value.details()
        no_adapter = dataclasses.replace(plan(), expected_versions=(PolicyRef("p", "coder", 0),))
        with pytest.raises(errors.FailedPrecondition, match="p/coder has not been loaded here"):
            [e async for e in c.collect(no_adapter)]  # a restarted LoRA replica has no adapters
        with pytest.raises(errors.NotFound):
            [
                e
                async for e in c.collect(
                    plan(agents={"a": AgentPlan("a", "zz"), "b": AgentPlan("b", "p")})
                )
            ]

    serve(tiny_model, go)


def test_bad_generate_requests(tiny_model):
    async def go(c, engine):
        with pytest.raises(errors.InvalidArgument, match="no prompt"):
            await c._call(c.stub.Generate, rollout_pb2.GenerateRequest(pool="p"))
        with pytest.raises(errors.NotFound, match="serves no pool 'q'"):
            await c.generate("q", messages=HELLO)
        with pytest.raises(errors.InvalidArgument, match="between 1 and 1024"):
            await c.generate("p", messages=HELLO, n=5000)
        with pytest.raises(errors.InvalidArgument, match="prompt is empty"):
            await c.generate("p", prompt_ids=[])

    serve(tiny_model, go)


def test_a_huge_prompt_renders_off_the_event_loop(tiny_model):
    """Rendering an 8 MiB message through the chat template takes seconds; meanwhile the replica
    still answers (here: a health check, issued once the render has started, returns before it
    ends). On the event loop, the render held every other call until it was done."""

    async def go(c, engine):
        started, ended = threading.Event(), threading.Event()
        render = engine.render

        def observed(*args):
            started.set()
            try:
                return render(*args)
            finally:
                ended.set()

        engine.render = observed
        huge = [{"role": "user", "content": "hello world " * (8 * 2**20 // 12)}]
        big = asyncio.create_task(
            c.generate("p", messages=huge, sampling=Sampling(max_tokens=2, max_prompt_tokens=32))
        )
        assert await asyncio.to_thread(started.wait, 60)
        assert await c.health() == "SERVING"
        assert not ended.is_set()
        gen = await big
        assert gen.prompt_truncated and len(gen.prompt_ids) == 32

    serve(tiny_model, go)


def test_collect_routes_other_pools_to_their_replicas(tiny_model):
    """L3 with pools on different replicas: one episode mixes agents of both."""

    async def go():
        registry = Registry(discover=False)
        registry.register(PickEnv)
        envs = LocalEnvs(EnvHost(registry))
        a = Replica({"A": PoolRuntime("A", HFEngine(tiny_model, device="cpu", dtype="float32"))})
        b_engine = HFEngine(tiny_model, device="cpu", dtype="float32")
        b = Replica({"B": PoolRuntime("B", b_engine)})
        server_a = await create_server(bindings(a, envs))
        server_b = await create_server(bindings(b, None))
        try:
            async with (
                RolloutClient(f"127.0.0.1:{server_a.port}") as ca,
                RolloutClient(f"127.0.0.1:{server_b.port}") as cb,
            ):
                await cb.load_weights(_perturbed(b_engine), "B", 1)
                sampling = Sampling(temperature=1.0, max_tokens=3)
                plan = CollectPlan(
                    env="pick",
                    turn_order=("a", "b"),
                    max_turns=1,
                    k=2,
                    tasks=(TaskRef("t", 0, episode=1),),
                    agents={
                        "a": AgentPlan("a", "A", sampling=sampling),
                        "b": AgentPlan("b", "B", sampling=sampling),
                    },
                )
                with pytest.raises(errors.NotFound, match="serves no pool 'B'"):
                    [e async for e in ca.collect(plan)]
                plan = dataclasses.replace(plan, pool_addresses={"B": f"127.0.0.1:{server_b.port}"})
                samples = [e async for e in ca.collect(plan) if isinstance(e, Sample)]
                return {(s.agent, s.policy.pool, s.policy.version) for s in samples}
        finally:
            await server_a.stop(0)
            await server_b.stop(0)

    assert asyncio.run(go()) == {("a", "A", 0), ("b", "B", 1)}


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

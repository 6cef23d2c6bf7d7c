"""rollout_svc with the tiny model over real gRPC: weight swaps. A push changes the outputs and the
version while bad pushes change nothing, a push travels in the dtype the replica serves, a CPU
engine adopts the pushed tensors, generations during a swap never mix versions, and per-agent
LoRA adapters are served with their own versions."""

import asyncio
import threading

import pytest
import torch

from atgrpo import errors
from atgrpo._proto.v1 import rollout_pb2
from atgrpo.contract import weight_payload as weights
from rollout_svc.client import push_weights
from tests.rollout.served import GREEDY, HELLO, _adapter, _perturbed, serve


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

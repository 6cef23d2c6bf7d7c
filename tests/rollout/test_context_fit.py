"""A prompt is cut to what fits the engine's context with room for max_tokens of response, on
every path (Generate by messages or by token ids, and the tree driver's render), instead of the
engine (vLLM) refusing the whole request. The tiny model over real gRPC, its context set to 64."""

import asyncio

import pytest

from atgrpo import errors
from atgrpo.contract.rollout import AgentPlan
from atgrpo.contract.sampling import Sampling
from atgrpo.rpc.server import create_server
from rollout_svc.client import RolloutClient
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings

CONTEXT = 64
LONG = [{"role": "user", "content": "alpha " + "hello world " * 100 + "omega?"}]  # ~200 tokens
# 2048 alone would not fit
SAMPLING = Sampling(temperature=0.0, max_tokens=16, max_prompt_tokens=2048)


def serve(model_dir, fn):
    async def go():
        engine = HFEngine(model_dir, device="cpu", dtype="float32")
        engine.max_model_len = CONTEXT  # as a vLLM engine started with --max-model-len 64
        replica = Replica({"p": PoolRuntime("p", engine)})
        running = await create_server(bindings(replica, None))
        try:
            async with RolloutClient(f"127.0.0.1:{running.port}") as c:
                return await fn(c, replica)
        finally:
            await running.stop(0)

    return asyncio.run(go())


def test_prompts_are_cut_to_the_context_less_max_tokens(tiny_model):
    async def go(c, replica):
        by_messages = await c.generate("p", messages=LONG, sampling=SAMPLING)
        assert by_messages.prompt_truncated and len(by_messages.prompt_ids) == CONTEXT - 16 == 48
        by_ids = await c.generate("p", prompt_ids=list(range(5, 205)), sampling=SAMPLING)
        assert by_ids.prompt_truncated and by_ids.prompt_ids == list(range(157, 205))  # the last 48
        tree = await replica.generate(AgentPlan("a", "p", sampling=SAMPLING), LONG, 1)
        assert tree.prompt_truncated and len(tree.prompt_ids) == 48
        # max_prompt_tokens below the room still rules; a prompt that fits is untouched.
        short = await c.generate(
            "p", messages=LONG, sampling=Sampling(max_tokens=16, max_prompt_tokens=30)
        )
        assert len(short.prompt_ids) == 30
        fits = await c.generate("p", prompt_ids=[5, 6, 7], sampling=SAMPLING)
        assert not fits.prompt_truncated and fits.prompt_ids == [5, 6, 7]
        for completion in by_messages.completions:
            assert len(completion.token_ids) <= 16

    serve(tiny_model, go)


def test_max_tokens_that_leave_no_room_are_refused_with_the_fix(tiny_model):
    async def go(c, replica):
        with pytest.raises(
            errors.InvalidArgument,
            match="max_tokens 64 leaves no room .* context length 64; lower max_tokens below 64",
        ):
            await c.generate("p", messages=LONG, sampling=Sampling(max_tokens=64))

    serve(tiny_model, go)

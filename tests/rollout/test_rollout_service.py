"""rollout_svc with the tiny model over real gRPC: Generate's log-probs (equal to a separate
forward pass under the same transform), stop strings, max tokens and prompt truncation, the
requests it refuses, and a huge prompt rendered off the event loop. Weight swaps and adapters are
in test_rollout_weights.py, Collect in test_rollout_collect.py, the metrics in
test_rollout_metrics.py; the server they all start in served.py."""

import asyncio
import threading

import pytest
import torch

from atgrpo import errors
from atgrpo._proto.v1 import rollout_pb2
from atgrpo.algo.sampling import transform_logits
from atgrpo.contract.sampling import Sampling
from tests.rollout.served import HELLO, serve


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

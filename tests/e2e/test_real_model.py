"""A real pretrained model through the five services: SmolLM2-135M-Instruct (a Llama with a 49,152
token vocabulary, a real BPE tokenizer and a ChatML template that adds its own system prompt),
one training step of the toy relay at L1 (full weights) and at L2 (a LoRA adapter per agent on
Llama's attention projections) with the hf engine. vLLM's run of the five services is on the
`small` tiny model (tests/rollout/test_vllm_engine.py), in the engine the vLLM tests start anyway:
a vLLM engine's start is most of a test, and one for SmolLM2 here was a third. The prompts checked
here are the chat template's render (rollout_svc.engines.render), the same code in both engines.

Kept short (2 tasks, K = 2, one turn, 4 new tokens) because a full step of a 135M model is about
a minute on 2 CPU cores. What each run checks is what a real tokenizer and template can break:
the prompt is the template's render, the response text is its token ids decoded without special
tokens, the trainer's recomputed log-probs equal the sampler's (approx_kl at the first update),
and the replicas serve the new version. A greedy request afterwards checks the stop token: the
model ends its turn with <|im_end|>, which is kept in the token ids and left out of the text.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import parse_config
from atgrpo.contract.sampling import Sampling
from atgrpo.discovery import listed_now
from rollout_svc.client import RolloutClient
from tests.e2e.toy_runs import Collect, served_versions, toy_config

# smollm2: the GGUF behind smollm2_model loads once per run, on the worker that runs the group
# (`--dist loadgroup`), rather than once on each worker that meets a SmolLM2 test.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2")]

IM_END = 2
QUESTION = [{"role": "user", "content": "What is 2+3? Answer with a number."}]


def smollm2_config(run_dir, model: str, level: str) -> dict:
    data = toy_config(run_dir, model, level, steps=1)
    data["run"]["tasks_per_step"] = 2
    data["env"]["max_turns"] = 1
    data["env"]["options"] = {"max_turns": 1}
    data["algorithm"].update(k=2, mini_batch_size=8)
    pool = data["pools"]["a"]
    # A pretrained model's learning rates, not the random tiny model's (5e-4 would wreck it).
    if level == "L2":
        pool.update(
            optim={"lr": 1e-4, "warmup_steps": 0},
            lora={"rank": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        )
    else:
        pool.update(optim={"lr": 1e-6, "warmup_steps": 0})
    return data


async def ask(cfg) -> list:
    address = listed_now(cfg.services.rollout["a"])[0]
    async with RolloutClient(address) as client:
        gen = await client.generate(
            "a", messages=QUESTION, sampling=Sampling(temperature=0.0, max_tokens=24)
        )
    return gen.completions


# L2 first: the first SmolLM2 test sets up smollm2_model (the GGUF's 20 s conversion), and L2's
# step is the shorter one (12 s to L1's 17), so neither comes near 40 s alone.
@pytest.mark.parametrize("level", ["L2", "L1"], ids=["L2-hf", "L1-hf"])
def test_one_step_with_smollm2(level, smollm2_model, tmp_path):
    from transformers import AutoTokenizer

    data = smollm2_config(tmp_path / "run", smollm2_model, level)
    cfg = parse_config(data)
    sink = Collect()
    with LocalServices(cfg) as running:
        final = asyncio.run(drive(running, sink))
        served = asyncio.run(served_versions(running))
        answer = asyncio.run(ask(running))[0]
    assert final["state"] == "finished", final

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    samples = [
        json.loads(line) for line in (tmp_path / "run" / "samples" / "step-000001.jsonl").open()
    ]
    assert len(samples) == 2 * 2 * 2  # tasks x agents x K, one turn
    for s in samples:
        prompt = tok.decode(s["prompt_ids"])
        secret = s["info"]["secret"]
        first = (
            f"speaker: the secret is {secret}"
            if s["agent"] == "speaker"
            else "listener: the speaker says:"
        )
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
            "<|im_start|>assistant\n"
        )
        assert first in prompt, prompt
        assert len(s["response_ids"]) == len(s["logprobs"]) <= 4
        assert all(0 <= t < 49152 for t in s["prompt_ids"] + s["response_ids"])
        assert s["response_text"] == tok.decode(s["response_ids"], skip_special_tokens=True)
        assert "<|im" not in s["response_text"]

    step = next(e for e in sink.events if e["kind"] == "step")
    pool = step["pools"]["a"]
    assert pool["version"] == 1 and pool["agents"] == {"speaker": 4, "listener": 4}
    # One update on the samples as drawn: the trainer's log-probs are the sampler's.
    assert pool["approx_kl"] < 1e-4, pool
    if level == "L2":
        assert served == {("a", "speaker"): 1, ("a", "listener"): 1, ("a", ""): 0}
    else:
        assert served == {("a", ""): 1}

    # The stop token: the base model (L2) or the one-step model (L1) answers and ends its turn.
    assert answer.finish_reason == "stop" and answer.token_ids[-1] == IM_END, answer
    assert "<|im_end|>" not in answer.text and answer.text.strip()

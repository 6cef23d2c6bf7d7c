"""atgrpo plan's trainer estimate against what real updates measure on CPU.

Per layer and token: the activation formula against the bytes autograd keeps (saved-tensor hooks),
exactly, in float32, under bf16 autocast over float32 masters (the residual stream stays float32,
and autocast casts a norm's output once per projection) and for a LoRA pool's frozen base.

Whole updates (issue 19: within 25%): each measurement runs in a fresh process (peak_worker.py: a
randomly initialised Qwen3-shaped model, AdamW, two optimizer steps so that the second forward and
backward run with the optimizer state allocated, the GPU examples' top-k/top-p transform); its peak
is the resident set's high-water mark less the resident set before the model was built. Measured
(2 cores, torch 2.13; the estimate is plan.trainer_peak: the resident parts plus the largest phase),
estimate / measured: float32 h256 0.94x, h512 0.97x, h512 checkpointed 1.09x; bf16 autocast h256
0.91x, checkpointed 1.05x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from atgrpo.config import AlgorithmConfig, PoolConfig
from atgrpo.memory import (
    activation_bytes_per_token_layer,
    trainer_components,
    trainer_peak,
)
from atgrpo.model_shape import ModelShape
from tests.conftest import ROOT

SIZES = {
    "h256-L2-v4096": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "vocab_size": 4096,
        "tie_word_embeddings": True,
    },
    "h512-L4-v8192": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_hidden_layers": 4,
        "vocab_size": 8192,
        "tie_word_embeddings": False,
    },
}
ROWS, PROMPT, RESPONSE = 4, 64, 192
TOKENS = ROWS * (PROMPT + RESPONSE)  # one micro-batch per optimizer step


# Sizes where every term of the per-layer formula differs (h, a, kv, i all distinct).
LAYER_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 48,
    "vocab_size": 512,
    "tie_word_embeddings": True,
    "model_type": "qwen3",
}


def saved_bytes(layers: int, tokens: int, regime: str) -> int:
    """Bytes autograd keeps for the backward of the decoder's forward (saved-tensor hooks, each
    storage once, the weights left out; autocast's casts of them go in the test's differences)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**{**LAYER_SHAPE, "num_hidden_layers": layers})
    model = AutoModelForCausalLM.from_config(
        config,
        dtype=torch.bfloat16 if regime == "lora" else torch.float32,
        attn_implementation="sdpa",
    )
    if regime == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=8, target_modules=list(LORA_TARGETS), lora_dropout=0.0)
        )
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def keep(t):
        if t.untyped_storage().data_ptr() not in weights:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, 500, (1, tokens), generator=torch.Generator().manual_seed(1))
    with (
        torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime != "float32"),
    ):
        model.get_decoder()(input_ids=ids, use_cache=False)
    return sum(seen.values())


LORA_TARGETS = ("q_proj", "v_proj", "o_proj", "up_proj")


@pytest.mark.parametrize("regime", ["float32", "bf16-masters", "lora"])
def test_activations_per_token_and_layer_are_what_autograd_keeps(regime):
    # Differences cancel what is not per token and per layer: the embedding's ids, the rotary
    # tables, the final norm; 3 layers less 2, 40 tokens less 24.
    per = (
        saved_bytes(3, 40, regime)
        - saved_bytes(3, 24, regime)
        - saved_bytes(2, 40, regime)
        + saved_bytes(2, 24, regime)
    ) / 16
    shape = ModelShape.from_config({**LAYER_SHAPE, "num_hidden_layers": 1})
    planned = {
        "float32": activation_bytes_per_token_layer(shape, 4),
        "bf16-masters": activation_bytes_per_token_layer(shape, 2, residual=4),
        "lora": activation_bytes_per_token_layer(shape, 2, lora_targets=LORA_TARGETS, lora_rank=8),
    }[regime]
    assert per == planned


def measure(config: dict, dtype: str = "float32", checkpointing: bool = False) -> int:
    spec = {
        "config": config,
        "dtype": dtype,
        "rows": ROWS,
        "prompt": PROMPT,
        "response": RESPONSE,
        "micro_batch_tokens": TOKENS,
        "checkpointing": checkpointing,
    }
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "trainer" / "peak_worker.py"), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])["peak"]


# bf16: autocast over float32 masters, as a GPU pool trains (slow on this CPU: the small size only).
@pytest.mark.slow
@pytest.mark.parametrize(
    "size, dtype, checkpointing",
    [
        ("h256-L2-v4096", "float32", False),
        ("h512-L4-v8192", "float32", False),
        ("h512-L4-v8192", "float32", True),
        ("h256-L2-v4096", "bfloat16", False),
        ("h256-L2-v4096", "bfloat16", True),
    ],
)
def test_trainer_estimate_within_25_percent_of_the_measured_peak(size, dtype, checkpointing):
    pool = PoolConfig(
        model_path="x",
        device="cpu",
        dtype=dtype,
        micro_batch_tokens=TOKENS,
        gradient_checkpointing=checkpointing,
    )
    parts = trainer_components(
        ModelShape.from_config(SIZES[size]),
        pool,
        AlgorithmConfig(),
        "cpu",
        tokens=TOKENS,
        response_tokens=ROWS * RESPONSE,
    )
    estimate = trainer_peak(parts)
    measured = measure(SIZES[size], dtype, checkpointing)
    print(
        f"{size} {dtype} checkpointing {checkpointing}: estimated {estimate / 2**20:.1f} MiB, "
        f"measured {measured / 2**20:.1f} MiB ({estimate / measured:.2f}x); "
        f"{ ({k: round(v / 2**20, 1) for k, v in parts.items() if v}) }"
    )
    assert abs(estimate - measured) <= 0.25 * measured

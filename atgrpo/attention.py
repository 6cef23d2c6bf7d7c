"""Grouped-query attention on CPU without copying the keys and values once per query head.

transformers' "sdpa" attention lets torch share a key/value head among its query heads
(`enable_gqa`) only when there is no attention mask; with one (any batch of prompts of different
lengths, left-padded) it first copies every cached key and value `num_key_value_groups` times
(`repeat_kv`). On CPU that copy is most of a decode step's attention: SmolLM2-135M (9 query heads,
3 key/value heads), 32 rows at ~400 positions, measured 7.8 ms a layer with the copy against
2.0 ms with `enable_gqa`, the same numbers; a decode step of real (padded) prompts took 380 ms
against 204 ms for prompts of one length, and 159 ms here (320 ms with the copy in that run, the
same tokens and log-probs). transformers keeps the copy because CUDA's fast kernels
take no mask with GQA; torch's CPU kernels do, so on CPU this module's "atgrpo_sdpa" passes the
mask and `enable_gqa` together, and everywhere else it is transformers' own sdpa.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

NAME = "atgrpo_sdpa"


def gqa_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, positions, dim) in, the output
    as (batch, positions, heads, dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if key.dtype != query.dtype:  # a float32 cache under 16-bit weights (the hf engine on CPU)
        out, _ = gqa_sdpa_forward(
            module,
            query.to(key.dtype),
            key,
            value,
            attention_mask,
            dropout,
            scaling,
            is_causal,
            **kwargs,
        )
        return out.to(query.dtype), None
    masked_gqa = (
        attention_mask is not None
        and query.device.type == "cpu"
        and getattr(module, "num_key_value_groups", 1) > 1
    )
    extras = any(kwargs.get(k) is not None for k in ("position_bias", "cache")) or kwargs.get(
        "output_attentions"
    )
    if not masked_gqa or extras:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # With a mask, causality is in the mask (transformers' sdpa passes is_causal=False then too).
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, gqa_sdpa_forward)
    # The same masks as "sdpa" (None where the batch needs none, so its fast path stays).
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_gqa_sdpa(model) -> bool:
    """Switch `model` from "sdpa" to "atgrpo_sdpa" (in place); other implementations (eager,
    flash attention) are left as they are. Returns whether it switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME

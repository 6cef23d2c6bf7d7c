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
import threading
from dataclasses import dataclass

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

    if (prefix := _take_prefix()) is not None and prefix.own is key:
        return shared_prefix_attention(query, prefix, key, value, scaling), None
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


@dataclass
class SharedPrefix:
    """The prompts' keys and values once per prompt, for a decode step whose rows are the prompts'
    samples (rollout_svc.engines.hf_shared): keys and values (P, Hkv, W, D), which of a prompt's W
    positions are real (P, W), each row's prompt (`slot`) and place among that prompt's rows
    (`rank`, below `width`: the most rows a prompt has), and the rows' own keys it goes with (the
    very tensor the cache handed the model: a prefix left behind by a step that failed between
    its cache update and its attention is never applied to another call). `own_real` (N, T):
    which of the rows' own positions are real, where rows joined a continuous batch at different
    steps and so hold different numbers of their own keys (None: all of them)."""

    keys: torch.Tensor
    values: torch.Tensor
    real: torch.Tensor
    slot: torch.Tensor
    rank: torch.Tensor
    width: int
    own: torch.Tensor
    own_real: torch.Tensor | None = None
    # mask_bias of `real` and of `own_real` in the keys' dtype, where the caller made them once for
    # a step's layers (None: made here)
    real_bias: torch.Tensor | None = None
    own_bias: torch.Tensor | None = None
    # rows in prompt order, `width` of each (dense_rows): the two layouts are views of each other
    dense: bool = False


def dense_rows(slot: torch.Tensor, prompts: int, width: int) -> bool:
    """Whether row i samples prompt i // width, for every one of `prompts` prompts (a fixed
    batch's K samples of each prompt, none ended yet)."""
    return slot.numel() == prompts * width > 0 and bool(
        (slot == torch.arange(prompts, device=slot.device).repeat_interleave(width)).all()
    )


_handoff = threading.local()


def attend_with_prefix(prefix: SharedPrefix) -> None:
    """Called by a cache layer's update: the attention call that follows in this thread (the same
    layer's, with the keys the update returned: each row's own) attends to `prefix` too."""
    _handoff.prefix = prefix


def _take_prefix() -> SharedPrefix | None:
    prefix = getattr(_handoff, "prefix", None)
    _handoff.prefix = None
    return prefix


def _by_prompt(x: torch.Tensor, p: SharedPrefix) -> torch.Tensor:
    """Rows (N, Hkv, G, X) to prompts (P, Hkv, width * G, X); zeros where a prompt has fewer."""
    n, h, g, d = x.shape
    if p.dense:  # a view: no zeros to write, no scatter (SmolLM2, 32 rows: ~40 us a layer)
        out = x.view(p.keys.shape[0], p.width, h, g, d)
    else:
        out = x.new_zeros((p.keys.shape[0], p.width, h, g, d))
        out[p.slot, p.rank] = x
    return out.permute(0, 2, 1, 3, 4).reshape(p.keys.shape[0], h, p.width * g, d)


def _by_row(x: torch.Tensor, p: SharedPrefix, g: int) -> torch.Tensor:
    """The inverse of _by_prompt: (P, Hkv, width * G, X) to the rows' (N, Hkv, G, X)."""
    n_p, h, _, d = x.shape
    rows = x.view(n_p, h, p.width, g, d).permute(0, 2, 1, 3, 4)
    if p.dense:
        return rows.reshape(n_p * p.width, h, g, d)
    return rows[p.slot, p.rank]


def shared_prefix_attention(
    query: torch.Tensor,
    prefix: SharedPrefix,
    keys: torch.Tensor,
    values: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """One decode position's attention over its prompt's keys (shared by the prompt's rows) and
    its row's own generated keys, in the keys' dtype: query (N, Hq, 1, D), keys and values
    (N, Hkv, T, D); returns (N, 1, Hq, D) in the query's dtype.

    The samples of one prompt share its keys and values, so each is read once a step for all of
    them, not once per row: a step's attention read the cache 32 times for 8 prompts x K 4. The
    prompt's scores of all its rows' query heads are one matmul; the softmax runs over prompt and
    own positions together (the same numbers as attending to their concatenation), in the
    prompts' layout: the prompt part, W positions wide, is never moved between the rows' layout
    and the prompts'; only the rows' own T scores and the D-wide query and output are (a decode
    step's attention on CPU was mostly such copies: SmolLM2, 32 rows, 31 ms a step of 75)."""
    n, hq, _, d = query.shape
    hkv = keys.shape[1]
    g = hq // hkv
    scale = d**-0.5 if scaling is None else scaling
    q = (query.to(keys.dtype) * scale).reshape(n, hkv, g, d)  # query head j reads key head j // g
    prompt = _by_prompt(q, prefix) @ prefix.keys.transpose(-1, -2)  # (P, Hkv, width*G, W)
    prompt += prefix.real_bias if prefix.real_bias is not None else mask_bias(prefix.real, q.dtype)
    # The rows' own keys and values are views of buffers reserved for the whole generation;
    # torch's bf16 batched matmul over such a view takes a slow path on CPU (SmolLM2, 32 rows, 40
    # own positions: 115 us against 35 for a contiguous copy, which itself takes 8).
    if keys.dtype != torch.float32:  # float32's takes no such path: the copy would only cost
        keys, values = keys.contiguous(), values.contiguous()
    own = q @ keys.transpose(-1, -2)  # (N, Hkv, G, T)
    if prefix.own_real is not None:
        own += (
            prefix.own_bias if prefix.own_bias is not None else mask_bias(prefix.own_real, q.dtype)
        )
    # A place of the prompts' layout with no row in it gets own scores of 0: a finite softmax,
    # read by no row.
    weights = torch.cat([prompt, _by_prompt(own, prefix)], dim=-1).softmax(dim=-1)
    w_prompt, w_own = weights.split([prefix.keys.shape[-2], keys.shape[-2]], dim=-1)
    out = _by_row(w_prompt @ prefix.values, prefix, g) + _by_row(w_own, prefix, g) @ values
    return out.reshape(n, 1, hq, d).to(query.dtype)


def mask_bias(real: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(X, 1, 1, Y): 0 where `real` (X, Y) holds, -inf where not, to add to scores: the same
    numbers as masking them (x + 0 is x). A decode step's caches make it once for the step's 30
    layers (SharedPrefix.real_bias): a masked fill of the prompt scores took 51 us a layer at 32
    rows, adding this 21."""
    bias = torch.zeros(real.shape, dtype=dtype, device=real.device)
    return bias.masked_fill_(~real, float("-inf"))[:, None, None, :]


class StepBiases:
    """mask_bias of a decode step's masks in the keys' dtype, made at the step's first layer and
    read by every other (a cache's per-step state holds one, renewed when its masks change)."""

    def __init__(self, *masks: torch.Tensor):
        self.masks = masks
        self._made: tuple[torch.dtype, tuple[torch.Tensor, ...]] | None = None

    def get(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        if self._made is None or self._made[0] != dtype:
            self._made = (dtype, tuple(mask_bias(m, dtype) for m in self.masks))
        return self._made[1]


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

"""Per-token log-probs (and entropies) of a batch's responses under the sampling transform, for
the update (trainer_svc/update.py) and its memory bound.

Two paths. The chunked head (plain linear output layers: Qwen2/3, Llama, Mistral) never holds a
micro-batch's (B, T, V) logits: it scores the decoder's hidden states pass by pass, bounded by
pass_elements(device) (_FusedHeadLogprobs); FSDP-sharded ones as a forward of their root. Other
models take the full logits from the model and transform them LOGPROB_CHUNK_TOKENS positions at
a time.

This module picks the path and runs it; the fused head's autograd Function is in
trainer_svc/fused_head.py, the decoder pass that runs each distinct prompt once in
trainer_svc/prompt_sharing.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from atgrpo.algo.sampling import transform_logits
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample
from atgrpo.memory import LOGPROB_CHUNK_ELEMENTS, logprob_pass_elements
from trainer_svc.fused_head import _FusedHeadLogprobs, _head_compute, _plain_linear
from trainer_svc.prompt_sharing import (
    _shared_prompt_hidden,
    prefix_sharing_available,
    prompt_groups,
)
from trainer_svc.sharding import FORWARD_METHOD, is_sharded, sharded_forward


# The chunked path's bound: logits elements (positions x vocabulary) per pass, sized by the
# device's memory (atgrpo.memory.logprob_pass_elements: 2**24 on a CPU, 110 positions of Qwen3's
# 151,936-token vocabulary; an 80 GiB GPU's 368). Its float32 temporaries (logits, the
# transform's, log-probs, and their gradients in the backward) are what bounds the log-prob
# path's memory. The passes run in one autograd Function
# (_FusedHeadLogprobs) whose backward recomputes one pass at a time and adds the output layer's
# weight gradient into its .grad as it goes, so the peak holds one pass's temporaries and no
# extra (V, H) gradient, whatever the micro-batch. (Liger Kernel's fused linear cross-entropy
# does the like on CUDA, but it scores plain softmax only: it cannot express top-k / top-p.)
@functools.cache
def pass_elements(device: str) -> int:
    """Logits per pass on `device`: the plan's figure for its memory (a CPU's: the fixed floor)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return LOGPROB_CHUNK_ELEMENTS
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return logprob_pass_elements(torch.cuda.get_device_properties(index).total_memory)


# The full-logits path's positions per transform pass (the decoder's (B, T, V) logits exist whole).
LOGPROB_CHUNK_TOKENS = 2048
# Architectures whose CausalLM forward is `lm_head(norm(decoder(x)))`: no logit scale, no
# softcapping, nothing after the output layer. Any other one takes the full-logits path, which
# runs the model's own forward (Gemma2's softcapping, Cohere's logit_scale, Granite's scaling).
_PLAIN_HEAD = frozenset({"qwen2", "qwen3", "llama", "mistral"})


# Saved, not recomputed: a backward recomputes each pass's logits (one more output-layer matmul
# per token) unless all of a call's log-probabilities fit in this many float32 elements (128 MiB),
# in which case the forward keeps them; a small micro-batch then costs what the full-logits path
# costs, and a large one stays within one pass's temporaries.
LOGPROB_KEEP_ELEMENTS = 2**25


def _stats_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, sampling: Sampling, entropy: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., V) logits -> the targets' log-probs and the entropies (...) under `sampling`.
    `entropy`: "grad" (a loss term), "metric" (no gradient), "none" (zeros)."""
    logp = torch.log_softmax(transform_logits(logits.float(), sampling), dim=-1)
    lp = logp.gather(-1, targets[..., None]).squeeze(-1)
    if entropy == "none":
        return lp, torch.zeros_like(lp)
    with torch.no_grad() if entropy == "metric" else contextlib.nullcontext():
        probs = logp.exp()
        ent = -(probs * torch.where(probs > 0, logp, torch.zeros_like(logp))).sum(-1)
    return lp, ent


def _head_stats(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    sampling: Sampling,
    entropy: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H) last hidden states -> the output layer's logits -> `_stats_from_logits`."""
    return _stats_from_logits(head(hidden), targets, sampling, entropy)


def _chunks(rows: int, positions: int, budget: int) -> list[tuple[int, int]]:
    step = max(1, budget // max(rows, 1))
    return [(t, min(t + step, positions)) for t in range(0, positions, step)]


def _entropy_mode(with_entropy: bool, entropy_grad: bool) -> str:
    return "none" if not with_entropy else "grad" if entropy_grad else "metric"


def _pad(batch: Sequence[TrainSample]):
    """Prompts left-padded and responses right-padded, so every response starts at column p_max:
    ids, attention mask, position ids (B, P + T), targets and mask (B, T)."""
    p_max = max(len(s.prompt_ids) for s in batch)
    t_max = max(len(s.response_ids) for s in batch)
    ids = torch.zeros((len(batch), p_max + t_max), dtype=torch.long)
    attn = torch.zeros_like(ids)
    targets = torch.zeros((len(batch), t_max), dtype=torch.long)
    mask = torch.zeros((len(batch), t_max))
    for i, s in enumerate(batch):
        p, n = len(s.prompt_ids), len(s.response_ids)
        ids[i, p_max - p : p_max] = torch.tensor(list(s.prompt_ids))
        ids[i, p_max : p_max + n] = torch.tensor(list(s.response_ids))
        attn[i, p_max - p : p_max + n] = 1
        targets[i, :n] = ids[i, p_max : p_max + n]
        mask[i, :n] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, targets, mask, p_max, t_max


def _by_sampling(batch: Sequence[TrainSample]) -> dict[Sampling, list[int]]:
    rows: dict[Sampling, list[int]] = {}
    for i, s in enumerate(batch):
        rows.setdefault(s.sampling, []).append(i)
    return rows


def chunked_head_available(model) -> bool:
    """Whether the chunked path applies: a plain output layer (see _PLAIN_HEAD). An FSDP model
    takes it as a forward of its root (sharding.sharded_forward), so its root's parameters are
    gathered while the decoder and the head are called apart."""
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in _PLAIN_HEAD
        and (not is_sharded(model) or hasattr(model, FORWARD_METHOD))
        and model.get_output_embeddings() is not None
    )


def hidden_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    samplings: dict[Sampling, list[int]],
    *,
    entropy: str = "grad",
    chunk_elements: int = LOGPROB_CHUNK_ELEMENTS,
    keep_elements: int | None = None,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked path from the decoder's last hidden states: (B, T, H) hidden states of the
    positions that predict each response token, targets and mask (B, T), the rows of each
    sampling setting -> log-probs and entropies (B, T), 0 off the mask.

    Only real tokens are scored, a pass of at most `chunk_elements` logits at a time (each
    position's figures are computed alone, so chunking changes no number). A plain nn.Linear head
    runs the fused passes (_FusedHeadLogprobs: its backward adds the head's weight gradient into
    its .grad pass by pass, and keeps the log-probs instead of recomputing them while they total
    at most `keep_elements`, default LOGPROB_KEEP_ELEMENTS); any other head (`fused=False`), each
    pass under checkpoint."""
    lp = torch.zeros(mask.shape, device=hidden.device)
    ent = torch.zeros(mask.shape, device=hidden.device)
    vocab = head.weight.shape[0]
    step = max(1, chunk_elements // vocab)
    fused = _plain_linear(head) if fused is None else fused
    keep_elements = LOGPROB_KEEP_ELEMENTS if keep_elements is None else keep_elements
    lp_parts, ent_parts, where = [], [], []
    for sampling, rows in samplings.items():
        sel = torch.zeros(mask.shape[0], dtype=torch.bool, device=mask.device)
        sel[rows] = True
        real = (mask > 0) & sel[:, None]
        flat_h, flat_t = hidden[real], targets[real]  # (N, H), (N,)
        if fused:
            keep = torch.is_grad_enabled() and len(flat_t) * vocab <= keep_elements
            keep_elements -= len(flat_t) * vocab if keep else 0  # the budget is the whole call's
            with _head_compute(head, hidden.device):
                part = _FusedHeadLogprobs.apply(
                    flat_h, head.weight, head.bias, flat_t, sampling, entropy, step, keep
                )
            lp_parts.append(part[0])
            ent_parts.append(part[1])
            where.append(real.nonzero(as_tuple=True))
            continue
        spans = [(t, min(t + step, len(flat_t))) for t in range(0, len(flat_t), step)]
        for t0, t1 in spans:
            args = (head, flat_h[t0:t1], flat_t[t0:t1], sampling, entropy)
            if len(spans) > 1 and torch.is_grad_enabled():
                part = checkpoint(_head_stats, *args, use_reentrant=False)
            else:
                part = _head_stats(*args)
            lp_parts.append(part[0])
            ent_parts.append(part[1])
        where.append(real.nonzero(as_tuple=True))
    if not lp_parts:
        return lp, ent
    rows_idx = torch.cat([w[0] for w in where])
    cols_idx = torch.cat([w[1] for w in where])
    lp = lp.index_put((rows_idx, cols_idx), torch.cat(lp_parts))
    ent = ent.index_put((rows_idx, cols_idx), torch.cat(ent_parts))
    return lp, ent


def response_logprobs(
    model,
    batch: Sequence[TrainSample],
    device: str,
    *,
    with_entropy: bool = True,
    entropy_grad: bool = True,
    chunk_elements: int | None = None,
    full_logits: bool = False,
    chunk_tokens: int = LOGPROB_CHUNK_TOKENS,
    share_prompts: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of each response under its own sampling transform.

    The decoder runs to its last hidden state; the output layer, the transform, the log-softmax
    and the gather of the sampled tokens run over `chunk_elements` logits at a time
    (hidden_logprobs), so no (B, T, V) tensor exists. The full-logits path (`full_logits`, and
    where the chunked one does not apply: chunked_head_available) runs the model's own forward
    for the response positions' logits, then the transform over `chunk_tokens` positions at a
    time. Both give the same numbers.
    Prompt sharing (`share_prompts`, on the chunked path where prefix_sharing_available): rows
    with the same prompt (the K branches of one (task, agent, turn) group) run that prompt
    through the decoder once, and their responses attend to its keys and values
    (_shared_prompt_hidden); the numbers and gradients are the unshared path's.
    Entropy: with a gradient when `entropy_grad` (an entropy bonus), else as a metric (no
    gradient, no memory kept for it); zeros when not `with_entropy`.
    Returns logprobs, entropy, mask: (B, T) with T the longest response; mask 1 on real tokens,
    and 0 in logprobs and entropy elsewhere. A real token outside the transform's support has
    log-prob -inf (policy_loss leaves it out).
    """
    ids, attn, pos, targets, mask, p_max, t_max = _pad(batch)
    entropy = _entropy_mode(with_entropy, entropy_grad)
    chunk_elements = chunk_elements or pass_elements(str(device))
    targets, mask = targets.to(device), mask.to(device)
    if not full_logits and chunked_head_available(model):
        share = (
            share_prompts
            and prefix_sharing_available(model)
            and len(prompt_groups(batch)[1]) < len(batch)
        )
        lp, ent = sharded_forward(
            model,
            _chunked_stats,
            model,
            batch,
            device,
            ids,
            attn,
            pos,
            targets,
            mask,
            entropy,
            chunk_elements,
            share,
        )
    else:
        lp, ent = _full_logits_stats(
            model,
            ids.to(device),
            attn.to(device),
            pos.to(device),
            targets,
            mask,
            _by_sampling(batch),
            entropy,
            chunk_tokens,
        )
    real = mask > 0  # where(), not a product: -inf * 0 is NaN on padding the transform excludes
    return (
        torch.where(real, lp, torch.zeros_like(lp)),
        torch.where(real, ent, torch.zeros_like(ent)),
        mask,
    )


def _chunked_stats(
    model, batch, device, ids, attn, pos, targets, mask, entropy, chunk_elements, share
):
    """The chunked path: the decoder's last hidden states (each distinct prompt once when
    `share`), then the head pass by pass (hidden_logprobs)."""
    if share:
        hidden = _shared_prompt_hidden(model.get_decoder(), batch, device)
    else:
        p_max, t_max = ids.shape[1] - targets.shape[1], targets.shape[1]
        out = model.get_decoder()(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            position_ids=pos.to(device),
            use_cache=False,
        )
        # (B, T, H): predicts each response token
        hidden = out.last_hidden_state[:, p_max - 1 : p_max - 1 + t_max]
    return hidden_logprobs(
        model.get_output_embeddings(),
        hidden,
        targets,
        mask,
        _by_sampling(batch),
        entropy=entropy,
        chunk_elements=chunk_elements,
    )


def _full_logits_stats(model, ids, attn, pos, targets, mask, samplings, entropy, chunk_tokens):
    """The full-logits path: the model's forward keeps the response positions' (B, T, V) logits."""
    out = model(
        input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=targets.shape[1] + 1
    )
    return logits_logprobs(
        out.logits[:, :-1], targets, mask, samplings, entropy=entropy, chunk_tokens=chunk_tokens
    )


def logits_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    samplings: dict[Sampling, list[int]],
    *,
    entropy: str = "grad",
    chunk_tokens: int = LOGPROB_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full-logits path from (B, T, V) logits (each predicting its response token): the
    transform runs `chunk_tokens` positions at a time (checkpointed past one pass)."""
    t_max = targets.shape[1]
    lp = torch.zeros(mask.shape, device=logits.device)
    ent = torch.zeros(mask.shape, device=logits.device)
    for sampling, rows in samplings.items():
        idx = torch.tensor(rows, device=logits.device)
        spans = _chunks(len(rows), t_max, chunk_tokens)
        for t0, t1 in spans:
            args = (logits[idx, t0:t1], targets[idx, t0:t1], sampling, entropy)
            if len(spans) > 1 and torch.is_grad_enabled():
                part = checkpoint(_stats_from_logits, *args, use_reentrant=False)
            else:
                part = _stats_from_logits(*args)
            lp[idx, t0:t1], ent[idx, t0:t1] = part
    return lp, ent

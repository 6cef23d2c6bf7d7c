"""Per-token log-probs (and entropies) of a batch's responses under the sampling transform, for
the update (trainer_svc/update.py) and its memory bound.

Two paths. The chunked head (plain linear output layers: Qwen2/3, Llama, Mistral) never holds a
micro-batch's (B, T, V) logits: it scores the decoder's hidden states pass by pass, bounded by
pass_elements(device) (_FusedHeadLogprobs); FSDP-sharded ones as a forward of their root. Other
models take the full logits from the model and transform them LOGPROB_CHUNK_TOKENS positions at
a time.
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
from trainer_svc.sharding import FORWARD_METHOD, HEAD_COMPUTE_DTYPE, is_sharded, sharded_forward


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
# Vocabulary rows of the output layer's weight gradient added per product when it is float32 and
# the matmul runs in bf16 (plan.py counts one such slice).
HEAD_GRAD_ROWS = 8192


def _compute_dtype(device: torch.device, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output layer's matmul runs in: autocast's where it is on (what head(hidden)
    would do), else the weight's."""
    kind = device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _head_compute(head: torch.nn.Module, device: torch.device):
    """A head held in float32 whose matmuls run in bf16 (HEAD_COMPUTE_DTYPE: an FSDP pool's, so
    its gradient sums in float32) runs them as under autocast (_compute_dtype)."""
    dtype = getattr(head, HEAD_COMPUTE_DTYPE, None)
    if dtype is None or torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _pass_logp(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, sampling: Sampling
) -> torch.Tensor:
    """One pass: (n, H) hidden rows -> (n, V) float32 log-probs under the transform (-inf off its
    support)."""
    logits = h @ w.T if b is None else torch.addmm(b, h, w.T)
    return torch.log_softmax(transform_logits(logits.float(), sampling), dim=-1)


def _column_major(w: torch.Tensor) -> torch.Tensor:
    """`w` (V, H) laid out column-major where the backward's d(logits) @ w needs it: on a CPU, a
    16-bit product whose right operand is row-major takes a slow path (2048x1536 by 1536x256 in
    bf16: 756 ms against 45 ms column-major, as a Linear's forward passes its weight). The same
    values; one (V, H) copy per backward, on CPU only (a GPU's GEMM takes either layout)."""
    if w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float16):
        return w.t().contiguous().t()
    return w


def _grad_add(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Adds to param.grad in place (allocating it the first time), as autograd's accumulation
    would."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    param.grad.add_(grad)


def _add_weight_grad(grad: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
    """grad += dz.T @ h. In place when the dtypes agree; a bf16 product into a float32 .grad goes
    HEAD_GRAD_ROWS vocabulary rows at a time, so no (V, H) product exists (Qwen3-8B's: 1.2 GiB)."""
    if grad.dtype == dz.dtype:
        grad.addmm_(dz.T, h)
        return
    for v0 in range(0, grad.shape[0], HEAD_GRAD_ROWS):
        grad[v0 : v0 + HEAD_GRAD_ROWS].add_(dz[:, v0 : v0 + HEAD_GRAD_ROWS].T @ h)


class _FusedHeadLogprobs(torch.autograd.Function):
    """Output layer + sampling transform + log-softmax + gather (+ entropy), a pass of `step`
    rows at a time, with no (N, V) tensor kept between passes.

    Forward: each pass's log-probs of the targets and entropies. Backward: each pass's log-probs
    again (recomputed, or kept when small: LOGPROB_KEEP_ELEMENTS), then d(logits) from the
    incoming gradients, exactly what autograd derives for the transform: with p the transformed
    distribution, lp = log p[target] and H = -sum p log p over its support,
        d(logits) = (g_lp (onehot(target) - p) - g_H p (log p + H)) / temperature
    on the support and 0 off it (top-k / top-p masks are piecewise constant; -inf logits carry no
    gradient), and 0 for a row whose target is outside the support (its log-prob is -inf; the loss
    leaves it out). The hidden rows' gradient is returned; the output layer's weight (and bias)
    gradient is added pass by pass straight into its .grad, so no second (V, H) buffer and no
    per-pass (V, H) gradients exist. (This is what autograd's accumulation into .grad does; the
    trainer sums .grad across ranks itself after the backward, _all_reduce_grads, and an FSDP model
    never takes this path: chunked_head_available.) A frozen output layer (LoRA) gets none.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, sampling, entropy, step, keep):
        cdt = _compute_dtype(hidden.device, weight)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cdt)
            b = None if bias is None else bias.to(cdt)
            n = hidden.shape[0]
            lp = torch.empty(n, device=hidden.device)
            ent = torch.zeros(n, device=hidden.device)
            kept = []
            for t0 in range(0, n, step):
                logp = _pass_logp(hidden[t0 : t0 + step].to(cdt), w, b, sampling)
                lp[t0 : t0 + step] = logp.gather(-1, targets[t0 : t0 + step, None]).squeeze(-1)
                if entropy != "none":
                    p = logp.exp()
                    # a scalar 0, not zeros_like: one (n, V) allocation and pass fewer
                    ent[t0 : t0 + step] = -(p * torch.where(p > 0, logp, 0.0)).sum(-1)
                    del p
                if keep:
                    kept.append(logp)
                del logp
        ctx.sampling, ctx.entropy, ctx.step, ctx.cdt = sampling, entropy, step, cdt
        ctx.kept = kept if keep else None
        ctx.weight, ctx.bias = weight, bias  # their .grad are written in the backward
        ctx.save_for_backward(hidden, weight, bias, targets, lp, ent)
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, _, _, targets, lp, ent = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        sampling, step, cdt = ctx.sampling, ctx.step, ctx.cdt
        want_w = weight.requires_grad
        want_b = bias is not None and bias.requires_grad
        want_h = ctx.needs_input_grad[0]
        n = hidden.shape[0]
        g_lp = torch.zeros(n, device=hidden.device) if g_lp is None else g_lp.float()
        # A target outside the support: log-prob -inf, no gradient (not -inf x 0 = NaN).
        g_lp = torch.where(torch.isfinite(lp), g_lp, torch.zeros_like(g_lp))
        g_ent = None if (ctx.entropy != "grad" or g_ent is None) else g_ent.float()
        scale = 1.0 / sampling.temperature if sampling.temperature > 0 else 1.0
        grad_h = torch.empty_like(hidden) if want_h else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cdt)
            b = None if bias is None else bias.to(cdt)
            if want_w and weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            w_h = _column_major(w) if want_h else None
            for i, t0 in enumerate(range(0, n, step)):
                t1 = min(t0 + step, n)
                h = hidden[t0:t1].to(cdt)
                logp = ctx.kept[i] if ctx.kept is not None else _pass_logp(h, w, b, sampling)
                p = logp.exp()
                g = g_lp[t0:t1, None]
                if g_ent is not None:
                    # d H / d log p = -p (log p + 1) on the support (0 off it), as autograd derives
                    # it
                    dlogp = torch.where(p > 0, logp, 0.0).add_(1).mul_(p).mul_(-g_ent[t0:t1, None])
                    dlogp.scatter_add_(-1, targets[t0:t1, None], g)
                    del logp
                    # log-softmax backward, then the temperature; p is 0 off the support, and so
                    # is dlogp.
                    dz = dlogp.sub_(p.mul_(dlogp.sum(-1, keepdim=True)))
                else:
                    # d log p is g at the target and 0 elsewhere, so its row sum is g and the
                    # log-softmax backward is onehot * g - p * g: the same numbers, bit for bit,
                    # without an (n, V) zeros, its row sum and a subtraction pass.
                    del logp
                    dz = p.mul_(-g).scatter_add_(-1, targets[t0:t1, None], g)
                del p
                if scale != 1.0:
                    dz.mul_(scale)
                dz = dz.to(cdt)
                if want_h:
                    grad_h[t0:t1] = (dz @ w_h).to(hidden.dtype)
                if want_w:
                    _add_weight_grad(weight.grad, dz, h)
                if want_b:
                    _grad_add(bias, dz.sum(0))
                del dz
        ctx.kept = None
        return grad_h, None, None, None, None, None, None, None


def _plain_linear(head: torch.nn.Module) -> bool:
    """An nn.Linear whose forward is its own (not an adapter-wrapped one): the fused pass
    applies."""
    return type(head) is torch.nn.Linear and not head._forward_hooks and not head._forward_pre_hooks


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


def prompt_groups(batch: Sequence[TrainSample]) -> tuple[list[int], list[Sequence[int]]]:
    """Each row's group (rows with the same prompt ids share one) and each group's prompt, in
    order of first appearance."""
    first: dict[tuple[int, ...], int] = {}
    rows = [first.setdefault(tuple(s.prompt_ids), len(first)) for s in batch]
    return rows, list(first)


def prefix_sharing_available(model) -> bool:
    """Whether the decoder can take a batch's prompts as a key/value cache for its responses.
    Not under gradient checkpointing: Hugging Face's checkpointed layers drop the cache in
    training; those models run the unshared path. Not under FSDP either: each layer would run
    two forwards (the prompts, then the responses) before one backward."""
    return not getattr(model, "is_gradient_checkpointing", False) and not is_sharded(model)


def _shared_prompt_hidden(decoder, batch: Sequence[TrainSample], device: str) -> torch.Tensor:
    """(B, T, H) last hidden states predicting each response token, computing each distinct
    prompt once: the U distinct prompts (left-padded) run as one batch that keeps its keys and
    values; the cache is gathered to the B rows (an index, so its gradient sums over a group's
    rows) and the right-padded responses run on it at their own positions. The state that
    predicts a response's first token is its prompt's last one. Rows and positions are the
    unshared path's, so each number is too, up to float rounding (attention sums in a
    different order); the gradient reaches a shared prompt's activations from every row of
    its group, which is what the unshared backward adds up row by row.

    Work: U x P + B x T positions instead of B x (P + T); at K branches a group with prompts
    r times the response length, (r/K + 1) / (r + 1) of it."""
    from transformers import DynamicCache

    group, prompts = prompt_groups(batch)
    p_max = max(len(p) for p in prompts)
    t_max = max(len(s.response_ids) for s in batch)
    p_ids = torch.zeros((len(prompts), p_max), dtype=torch.long)
    p_attn = torch.zeros_like(p_ids)
    for u, p in enumerate(prompts):
        p_ids[u, p_max - len(p) :] = torch.tensor(list(p))
        p_attn[u, p_max - len(p) :] = 1
    p_pos = (p_attn.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = decoder(
        input_ids=p_ids.to(device),
        attention_mask=p_attn.to(device),
        position_ids=p_pos.to(device),
        past_key_values=cache,
        use_cache=True,
    )
    rows = torch.tensor(group, device=device)
    cache.batch_select_indices(rows)
    r_ids = torch.zeros((len(batch), t_max), dtype=torch.long)
    r_attn = torch.cat([p_attn[group], torch.zeros((len(batch), t_max), dtype=torch.long)], dim=1)
    for i, s in enumerate(batch):
        r_ids[i, : len(s.response_ids)] = torch.tensor(list(s.response_ids))
        r_attn[i, p_max : p_max + len(s.response_ids)] = 1
    r_pos = torch.tensor([len(s.prompt_ids) for s in batch])[:, None] + torch.arange(t_max)
    resp = decoder(
        input_ids=r_ids.to(device),
        attention_mask=r_attn.to(device),
        position_ids=r_pos.to(device),
        past_key_values=cache,
        use_cache=True,
    )
    last = out.last_hidden_state[:, -1][rows]  # (B, H): predicts each first response token
    return torch.cat([last[:, None], resp.last_hidden_state[:, : t_max - 1]], dim=1)


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

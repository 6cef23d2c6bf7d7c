"""One AT-GRPO update of a pool's model from a step's samples (plain logic, no gRPC).

Samples are validated whole before anything trains. Each of `epochs` passes walks the samples in
mini-batches (one optimizer step each); a mini-batch is split into micro-batches by a token
budget, and every micro-batch's loss is weighted by its share of the mini-batch's tokens, so the
gradient is the token-mean over the whole mini-batch whatever the micro-batching (1 x 8 equals
8 x 1). On a LoRA pool each agent's policy updates on its own, as the paper's per-agent
updates do: an agent's mini-batches hold only its samples, run with its adapter active, are a
token-mean over its own tokens and clip its adapter's gradient by its own norm, so an agent's
samples update only its adapter and never scale another agent's step.

With kl_coef > 0 every micro-batch is also scored by the frozen reference (no gradient) and the
loss adds kl_coef x the token-mean k3 KL to it (atgrpo.algo.loss).

On a pool spread over several ranks (torchrun; see sharding.py and distributed.py) every rank
runs `update` on the same samples at once and takes its share of each mini-batch; the gradients
are summed across ranks (all-reduce when replicated, FSDP's reduce-scatter when sharded), so the
update equals the single-process one.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from atgrpo.algo.loss import policy_loss
from atgrpo.algo.sampling import transform_logits
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample, UpdateConfig
from atgrpo.errors import InvalidArgument
from trainer_svc.sharding import is_sharded, world

METRIC_KEYS = ("loss", "clip_fraction", "approx_kl", "entropy")

# The frozen reference for the KL term: a context that yields the model to score with (a LoRA
# pool's base with its adapters off, or a full pool's initial weights).
Reference = Callable[[], contextlib.AbstractContextManager]


def validate(samples: Sequence[TrainSample], agents: Sequence[str], max_tokens: int | None = None) -> None:
    """InvalidArgument naming the first bad sample; nothing trains from a bad request.
    `max_tokens`: the micro-batch budget; a longer sample cannot fit in memory as configured."""
    if not samples:
        raise InvalidArgument("no samples to train on")
    for i, s in enumerate(samples):
        where = f"sample {i} (agent {s.agent!r})"
        if s.agent not in agents:
            raise InvalidArgument(f"{where}: this pool trains {list(agents)}, not {s.agent!r}; route it to its pool")
        if not s.response_ids:
            raise InvalidArgument(f"{where}: empty response; drop it before training")
        if not s.prompt_ids:
            raise InvalidArgument(f"{where}: empty prompt")
        if len(s.old_logprobs) != len(s.response_ids):
            raise InvalidArgument(f"{where}: {len(s.response_ids)} response tokens but {len(s.old_logprobs)} "
                                  "log-probs; send one log-prob per token")
        if not math.isfinite(s.advantage):
            raise InvalidArgument(f"{where}: advantage {s.advantage} is not finite")
        # -inf is a token the sampling distribution excludes (the loss leaves it out); NaN and
        # +inf are no log-probability at all.
        if not all(x == -math.inf or math.isfinite(x) for x in s.old_logprobs):
            raise InvalidArgument(f"{where}: a log-prob is NaN or +inf; send log-probs <= 0 (-inf allowed)")
        length = len(s.prompt_ids) + len(s.response_ids)
        if max_tokens is not None and length > max_tokens:
            raise InvalidArgument(f"{where}: {length} tokens, over the trainer's micro-batch budget of "
                                  f"{max_tokens}; raise micro_batch_tokens or cap prompts and responses")


def micro_batches(rows: Sequence[int], samples: Sequence[TrainSample], budget: int) -> list[list[int]]:
    """Consecutive rows packed while the padded size (rows x longest) stays within `budget`."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for r in rows:
        length = len(samples[r].prompt_ids) + len(samples[r].response_ids)
        if cur and max(longest, length) * (len(cur) + 1) > budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(r)
        longest = max(longest, length)
    if cur:
        out.append(cur)
    return out


# The chunked path's bound: logits elements (positions x vocabulary) per pass. Its float32
# temporaries (logits, the transform's sort and softmax, log-probs, and their gradients in the
# backward) are what bounds the log-prob path's memory: 2**24 elements are 64 MiB each, 110
# positions of Qwen3's 151,936-token vocabulary. The passes run in one autograd Function
# (_FusedHeadLogprobs) whose backward recomputes one pass at a time and adds the output layer's
# weight gradient into its .grad as it goes, so the peak holds one pass's temporaries and no
# extra (V, H) gradient, whatever the micro-batch. (Liger Kernel's fused linear cross-entropy
# does the like on CUDA, but it scores plain softmax only: it cannot express top-k / top-p.)
LOGPROB_CHUNK_ELEMENTS = 2 ** 24
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
LOGPROB_KEEP_ELEMENTS = 2 ** 25


def _compute_dtype(device: torch.device, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output layer's matmul runs in: autocast's where it is on (what head(hidden)
    would do), else the weight's."""
    kind = device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _pass_logp(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, sampling: Sampling) -> torch.Tensor:
    """One pass: (n, H) hidden rows -> (n, V) float32 log-probs under the transform (-inf off its support)."""
    logits = h @ w.T if b is None else torch.addmm(b, h, w.T)
    return torch.log_softmax(transform_logits(logits.float(), sampling), dim=-1)


def _grad_add(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Adds to param.grad in place (allocating it the first time), as autograd's accumulation would."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    param.grad.add_(grad)


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
                logp = _pass_logp(hidden[t0:t0 + step].to(cdt), w, b, sampling)
                lp[t0:t0 + step] = logp.gather(-1, targets[t0:t0 + step, None]).squeeze(-1)
                if entropy != "none":
                    p = logp.exp()
                    ent[t0:t0 + step] = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
                    del p
                if keep:
                    kept.append(logp)
                del logp
        ctx.sampling, ctx.entropy, ctx.step, ctx.cdt = sampling, entropy, step, cdt
        ctx.kept = kept if keep else None
        ctx.weight, ctx.bias = weight, bias      # their .grad are written in the backward
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
            for i, t0 in enumerate(range(0, n, step)):
                t1 = min(t0 + step, n)
                h = hidden[t0:t1].to(cdt)
                logp = ctx.kept[i] if ctx.kept is not None else _pass_logp(h, w, b, sampling)
                p = logp.exp()
                if g_ent is not None:
                    # d H / d log p = -p (log p + 1) on the support (0 off it), as autograd derives it
                    dlogp = torch.where(p > 0, logp, torch.zeros_like(logp)).add_(1).mul_(p).mul_(-g_ent[t0:t1, None])
                else:
                    dlogp = torch.zeros_like(logp)
                dlogp.scatter_add_(-1, targets[t0:t1, None], g_lp[t0:t1, None])
                del logp
                # log-softmax backward, then the temperature; p is 0 off the support, and so is dlogp.
                dz = dlogp.sub_(p.mul_(dlogp.sum(-1, keepdim=True)))
                del p
                if scale != 1.0:
                    dz.mul_(scale)
                dz = dz.to(cdt)
                if want_h:
                    grad_h[t0:t1] = (dz @ w).to(hidden.dtype)
                if want_w:
                    if weight.grad.dtype == cdt:
                        weight.grad.addmm_(dz.T, h)
                    else:       # bf16 compute into a float32 .grad: one pass's (V, H) product, then added
                        weight.grad.add_(dz.T @ h)
                if want_b:
                    _grad_add(bias, dz.sum(0))
                del dz
        ctx.kept = None
        return grad_h, None, None, None, None, None, None, None


def _plain_linear(head: torch.nn.Module) -> bool:
    """An nn.Linear whose forward is its own (not an adapter-wrapped one): the fused pass applies."""
    return type(head) is torch.nn.Linear and not head._forward_hooks and not head._forward_pre_hooks


def _stats_from_logits(logits: torch.Tensor, targets: torch.Tensor, sampling: Sampling,
                       entropy: str) -> tuple[torch.Tensor, torch.Tensor]:
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


def _head_stats(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, sampling: Sampling,
                entropy: str) -> tuple[torch.Tensor, torch.Tensor]:
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
        ids[i, p_max - p:p_max] = torch.tensor(list(s.prompt_ids))
        ids[i, p_max:p_max + n] = torch.tensor(list(s.response_ids))
        attn[i, p_max - p:p_max + n] = 1
        targets[i, :n] = ids[i, p_max:p_max + n]
        mask[i, :n] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, targets, mask, p_max, t_max


def _by_sampling(batch: Sequence[TrainSample]) -> dict[Sampling, list[int]]:
    rows: dict[Sampling, list[int]] = {}
    for i, s in enumerate(batch):
        rows.setdefault(s.sampling, []).append(i)
    return rows


def chunked_head_available(model) -> bool:
    """Whether the chunked path applies: a plain output layer (see _PLAIN_HEAD), and not an FSDP
    model (its root's parameters are gathered by the root's forward hooks, which calling the
    decoder and the head apart would skip)."""
    config = getattr(model, "config", None)
    return (getattr(config, "model_type", None) in _PLAIN_HEAD and not is_sharded(model)
            and model.get_output_embeddings() is not None)


def hidden_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                    samplings: dict[Sampling, list[int]], *, entropy: str = "grad",
                    chunk_elements: int = LOGPROB_CHUNK_ELEMENTS, keep_elements: int | None = None,
                    fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
        flat_h, flat_t = hidden[real], targets[real]                           # (N, H), (N,)
        if fused:
            keep = torch.is_grad_enabled() and len(flat_t) * vocab <= keep_elements
            keep_elements -= len(flat_t) * vocab if keep else 0     # the budget is the whole call's
            part = _FusedHeadLogprobs.apply(flat_h, head.weight, head.bias, flat_t, sampling, entropy, step, keep)
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


def response_logprobs(model, batch: Sequence[TrainSample], device: str, *, with_entropy: bool = True,
                      entropy_grad: bool = True, chunk_elements: int = LOGPROB_CHUNK_ELEMENTS,
                      full_logits: bool = False, chunk_tokens: int = LOGPROB_CHUNK_TOKENS,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of each response under its own sampling transform.

    The decoder runs to its last hidden state; the output layer, the transform, the log-softmax
    and the gather of the sampled tokens run over `chunk_elements` logits at a time
    (hidden_logprobs), so no (B, T, V) tensor exists. The full-logits path (`full_logits`, and
    where the chunked one does not apply: chunked_head_available) runs the model's own forward
    for the response positions' logits, then the transform over `chunk_tokens` positions at a
    time. Both give the same numbers.
    Entropy: with a gradient when `entropy_grad` (an entropy bonus), else as a metric (no
    gradient, no memory kept for it); zeros when not `with_entropy`.
    Returns logprobs, entropy, mask: (B, T) with T the longest response; mask 1 on real tokens,
    and 0 in logprobs and entropy elsewhere. A real token outside the transform's support has
    log-prob -inf (policy_loss leaves it out).
    """
    ids, attn, pos, targets, mask, p_max, t_max = _pad(batch)
    entropy = _entropy_mode(with_entropy, entropy_grad)
    targets, mask = targets.to(device), mask.to(device)
    if not full_logits and chunked_head_available(model):
        out = model.get_decoder()(input_ids=ids.to(device), attention_mask=attn.to(device),
                                  position_ids=pos.to(device), use_cache=False)
        hidden = out.last_hidden_state[:, p_max - 1:p_max - 1 + t_max]         # (B, T, H): predicts each response token
        lp, ent = hidden_logprobs(model.get_output_embeddings(), hidden, targets, mask, _by_sampling(batch),
                                  entropy=entropy, chunk_elements=chunk_elements)
    else:
        lp, ent = _full_logits_stats(model, ids.to(device), attn.to(device), pos.to(device), targets, mask,
                                     _by_sampling(batch), entropy, chunk_tokens)
    real = mask > 0     # where(), not a product: -inf * 0 is NaN on padding the transform excludes
    return torch.where(real, lp, torch.zeros_like(lp)), torch.where(real, ent, torch.zeros_like(ent)), mask


def _full_logits_stats(model, ids, attn, pos, targets, mask, samplings, entropy, chunk_tokens):
    """The full-logits path: the model's forward keeps the response positions' (B, T, V) logits."""
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=targets.shape[1] + 1)
    return logits_logprobs(out.logits[:, :-1], targets, mask, samplings, entropy=entropy, chunk_tokens=chunk_tokens)


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                    samplings: dict[Sampling, list[int]], *, entropy: str = "grad",
                    chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
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


def _micro_batches(rows: Sequence[int], samples: Sequence[TrainSample], cfg: UpdateConfig) -> list[list[int]]:
    return micro_batches(rows, samples, cfg.micro_batch_tokens) if rows else []


def _plan(mini: Sequence[int], samples: Sequence[TrainSample], cfg: UpdateConfig,
          rank: int, world_size: int, sharded: bool) -> list[tuple[list[int], float]]:
    """This rank's micro-batches of a mini-batch (rows rank::world), each with a weight: 1, or 0
    for padding. FSDP all-gathers in every forward and reduce-scatters in every backward, so
    under FSDP every rank must run as many micro-batches: one with fewer repeats a real row at
    weight 0 (it adds nothing to the gradient but takes part in the collectives)."""
    mine = [(m, 1.0) for m in _micro_batches(mini[rank::world_size], samples, cfg)]
    if sharded:
        most = max(len(_micro_batches(mini[r::world_size], samples, cfg)) for r in range(world_size))
        mine += [([mini[0]], 0.0)] * (most - len(mine))
    return mine


def _old_logprobs(batch: Sequence[TrainSample], like: torch.Tensor) -> torch.Tensor:
    old = torch.zeros_like(like)
    for i, s in enumerate(batch):
        old[i, :len(s.old_logprobs)] = torch.tensor(list(s.old_logprobs))
    return old


def _micro_step(model, batch: Sequence[TrainSample], cfg: UpdateConfig, device: str, share: float,
                reference: Reference | None) -> dict[str, float]:
    """Forward and backward of one micro-batch, its loss scaled by `share` (its part of the
    mini-batch's tokens); returns its share-weighted metrics and its masked-token count."""
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
        # The entropy carries a gradient only as a bonus; otherwise it is a metric.
        lp, ent, mask = response_logprobs(model, batch, device, entropy_grad=bool(cfg.loss.entropy_coef))
        ref = None
        if cfg.loss.kl_coef and reference is not None:
            with torch.no_grad(), reference() as ref_model:
                ref = response_logprobs(ref_model, batch, device, with_entropy=False)[0]
    adv = torch.tensor([s.advantage for s in batch], device=device)
    loss, m = policy_loss(lp, _old_logprobs(batch, lp), adv, mask, cfg.loss, ref_logprobs=ref, entropy=ent)
    (loss * share).backward()
    return {k: m[k] * share for k in _mean_keys(cfg)} | {"masked_tokens": m["masked_tokens"]}


def _mean_keys(cfg: UpdateConfig) -> tuple[str, ...]:
    return (*METRIC_KEYS, "kl_ref") if cfg.loss.kl_coef else METRIC_KEYS


def _all_reduce_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Data parallelism: sum the gradients (each rank's share-weighted) across ranks. A
    parameter no rank touched keeps grad None, so the optimizer leaves it alone (an adapter
    whose agent had no samples must not move, not even by weight decay)."""
    dist = torch.distributed
    touched = torch.tensor([float(p.grad is not None) for p in params])
    dist.all_reduce(touched, op=dist.ReduceOp.MAX)
    for p, t in zip(params, touched.tolist(), strict=True):
        if t:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)


def _sum_over_ranks(stats: dict[str, float]) -> None:
    """Each rank's metrics are weighted by its share of the mini-batch: their sum is the mean."""
    dist = torch.distributed
    keys = sorted(stats)
    values = torch.tensor([stats[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values)
    stats.update(zip(keys, values.tolist(), strict=True))


def _clip(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
    # Under FSDP the norm is a replicated DTensor, already reduced over every rank's shards.
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _mini_batch(model, samples: Sequence[TrainSample], mini: Sequence[int], cfg: UpdateConfig, device: str,
                agent: str | None, adapter, sharded: bool, reference: Reference | None) -> dict[str, float]:
    """Accumulate this rank's gradients for one mini-batch (of one agent when `agent` is set, with
    its adapter active); returns its share-weighted metrics."""
    rank, world_size = world()
    total = sum(len(samples[r].response_ids) for r in mini)
    stats = dict.fromkeys((*_mean_keys(cfg), "masked_tokens"), 0.0)
    for micro, weight in _plan(mini, samples, cfg, rank, world_size, sharded):
        batch = [samples[r] for r in micro]
        share = weight * sum(len(s.response_ids) for s in batch) / total
        with adapter(agent) if agent is not None else contextlib.nullcontext():
            for k, v in _micro_step(model, batch, cfg, device, share, reference).items():
                stats[k] += v * weight if k == "masked_tokens" else v   # padding rows count no tokens
    return stats


def _agent_order(seed: int, agent: str, n: int) -> list[int]:
    """An agent's own shuffle: from one draw of the pool's generator and the agent's name, so it
    does not depend on how many samples the other agents had."""
    generator = torch.Generator().manual_seed((seed + zlib.crc32(agent.encode())) % 2**63)
    return torch.randperm(n, generator=generator).tolist()


def steps_of_epoch(samples: Sequence[TrainSample], mini_batch_size: int, per_agent: bool,
                   generator: torch.Generator | None) -> list[list[tuple[str | None, list[int]]]]:
    """Each optimizer step of one epoch as its clip groups: (agent, rows) pairs.

    One shared model: one group (agent None) per step, `mini_batch_size` rows of one shuffle of
    all samples. Per-agent adapters (LoRA) update each agent's policy on its own: each agent's
    rows are shuffled apart, step i holds the i-th mini-batch of every agent that has one, and
    each group's loss is a token-mean over its own tokens and clipped on its own, so one agent's
    samples never change another agent's step."""
    if not per_agent:
        order = torch.randperm(len(samples), generator=generator).tolist()
        return [[(None, order[i:i + mini_batch_size])] for i in range(0, len(order), mini_batch_size)]
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    rows: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        rows.setdefault(s.agent, []).append(i)
    minis = {a: [[r[j] for j in _agent_order(seed, a, len(r))][i:i + mini_batch_size]
                 for i in range(0, len(r), mini_batch_size)] for a, r in rows.items()}
    steps = max(len(m) for m in minis.values())
    return [[(a, m[i]) for a, m in minis.items() if i < len(m)] for i in range(steps)]


def adapter_params(model, agent: str) -> list[torch.nn.Parameter]:
    """The trainable parameters of `agent`'s LoRA adapter (PEFT names them lora_X.<adapter>)."""
    return [p for n, p in model.named_parameters() if "lora_" in n and f".{agent}." in n]


def update(model, optimizer: torch.optim.Optimizer, samples: Sequence[TrainSample], cfg: UpdateConfig, *,
           params: Sequence[torch.nn.Parameter], device: str = "cpu",
           adapter: Callable[[str], contextlib.AbstractContextManager] | None = None,
           generator: torch.Generator | None = None, reference: Reference | None = None) -> dict[str, float]:
    """Run the update; returns averaged metrics (per agent of a LoRA pool also `grad_norm/<agent>`).
    `adapter(agent)` activates an agent's LoRA adapter (None: one shared model). `generator`
    seeds the mini-batch order (exact resume). `reference()` gives the frozen reference model
    for the KL term (used only when kl_coef > 0).

    Under torch.distributed every rank gets the same samples and generator seed and works on its
    share of each mini-batch (rows rank::world). Replicated (ddp): gradients are summed by
    all-reduce before each step. Sharded (an FSDP2 `model`, see sharding.py): FSDP sums them
    by reduce-scatter in every backward, and each rank steps its own shard. Either way the
    result is the single-process one whatever the world size."""
    if cfg.loss.kl_coef and reference is None:
        raise ValueError("kl_coef > 0 needs the frozen reference: pass reference=")
    world_size = world()[1]
    sharded = is_sharded(model)
    stats: dict[str, float] = dict.fromkeys((*_mean_keys(cfg), "grad_norm", "masked_tokens"), 0.0)
    norms: dict[str, list[float]] = {}
    groups = steps = 0
    model.train()
    for _ in range(cfg.epochs):
        for step in steps_of_epoch(samples, cfg.mini_batch_size, adapter is not None, generator):
            optimizer.zero_grad(set_to_none=True)
            parts = {f"{i}/{k}": v for i, (agent, rows) in enumerate(step)
                     for k, v in _mini_batch(model, samples, rows, cfg, device, agent, adapter, sharded,
                                             reference).items()}
            if world_size > 1:
                _sum_over_ranks(parts)
                if not sharded:
                    _all_reduce_grads(params)
            for key, v in parts.items():
                stats[key.split("/", 1)[1]] += v
            for agent, _ in step:
                norm = _clip(params if agent is None else adapter_params(model, agent), cfg.grad_clip)
                norms.setdefault(agent or "", []).append(norm)
                stats["grad_norm"] += norm
            optimizer.step()
            groups += len(step)
            steps += 1
    # masked_tokens: of the samples (each epoch sees them again); the rest: means over the groups.
    out = {k: v / cfg.epochs if k == "masked_tokens" else v / max(groups, 1) for k, v in stats.items()}
    per_agent = {f"grad_norm/{a}": sum(n) / len(n) for a, n in norms.items() if a}
    return out | per_agent | {"optimizer_steps": float(steps)}

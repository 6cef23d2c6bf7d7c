"""One AT-GRPO update of a pool's model from a step's samples (plain logic, no gRPC).

Samples are validated whole before anything trains. Each of `epochs` passes walks the samples in
mini-batches (one optimizer step each); a mini-batch is split into micro-batches by a token
budget, and every micro-batch's loss is weighted by its share of the mini-batch's tokens, so the
gradient is the token-mean over the whole mini-batch whatever the micro-batching (1 x 8 equals
8 x 1). On a LoRA pool a micro-batch holds one agent's samples and runs with that agent's
adapter active: an agent's samples update only its adapter.

On a pool spread over several ranks (torchrun; see sharding.py and distributed.py) every rank
runs `update` on the same samples at once and takes its share of each mini-batch; the gradients
are summed across ranks (all-reduce when replicated, FSDP's reduce-scatter when sharded), so the
update equals the single-process one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch

from atgrpo.algo.loss import policy_loss
from atgrpo.algo.sampling import transform_logits
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample, UpdateConfig
from atgrpo.errors import InvalidArgument
from trainer_svc.sharding import is_sharded, world

METRIC_KEYS = ("loss", "clip_fraction", "approx_kl", "entropy")


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
        if not all(math.isfinite(x) for x in s.old_logprobs):
            raise InvalidArgument(f"{where}: a log-prob is not finite")
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


def response_logprobs(model, batch: Sequence[TrainSample], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of each response under its own sampling transform.

    Prompts are left-padded and responses right-padded, so every response starts at the same
    column: the model computes logits for the response positions only, and the transform runs
    once per distinct sampling setting instead of once per row.
    Returns logprobs, entropy, mask: (B, T) with T the longest response; mask 1 on real tokens.
    """
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
    out = model(input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                logits_to_keep=t_max + 1)
    logits = out.logits[:, :-1].float()                                     # (B, T, V): predicts each response token
    logp = torch.empty_like(logits)
    rows_by_sampling: dict[Sampling, list[int]] = {}
    for i, s in enumerate(batch):
        rows_by_sampling.setdefault(s.sampling, []).append(i)
    for sampling, rows in rows_by_sampling.items():
        idx = torch.tensor(rows, device=logits.device)
        logp[idx] = torch.log_softmax(transform_logits(logits[idx], sampling), dim=-1)
    targets, mask = targets.to(device), mask.to(device)
    lp = logp.gather(-1, targets[..., None]).squeeze(-1) * mask            # (B, T)
    probs = logp.exp()
    ent = -(probs * torch.where(probs > 0, logp, torch.zeros_like(logp))).sum(-1) * mask   # (B, T)
    return lp, ent, mask


def _by_agent(rows: Sequence[int], samples: Sequence[TrainSample]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for r in rows:
        groups.setdefault(samples[r].agent, []).append(r)
    return list(groups.values())


def _micro_plan(rows: Sequence[int], samples: Sequence[TrainSample], cfg: UpdateConfig,
                by_agent: bool) -> list[list[int]]:
    groups = (_by_agent(rows, samples) if by_agent else [rows]) if rows else []
    return [m for g in groups for m in micro_batches(g, samples, cfg.micro_batch_tokens)]


def _plan(mini: Sequence[int], samples: Sequence[TrainSample], cfg: UpdateConfig, by_agent: bool,
          rank: int, world_size: int, sharded: bool) -> list[tuple[list[int], float]]:
    """This rank's micro-batches of a mini-batch (rows rank::world), each with a weight: 1, or 0
    for padding. FSDP all-gathers in every forward and reduce-scatters in every backward, so
    under FSDP every rank must run as many micro-batches: one with fewer repeats a real row at
    weight 0 (it adds nothing to the gradient but takes part in the collectives)."""
    mine = [(m, 1.0) for m in _micro_plan(mini[rank::world_size], samples, cfg, by_agent)]
    if sharded:
        most = max(len(_micro_plan(mini[r::world_size], samples, cfg, by_agent)) for r in range(world_size))
        mine += [([mini[0]], 0.0)] * (most - len(mine))
    return mine


def _micro_step(model, batch: Sequence[TrainSample], cfg: UpdateConfig, device: str, share: float) -> dict[str, float]:
    """Forward and backward of one micro-batch, its loss scaled by `share` (its part of the
    mini-batch's tokens); returns its share-weighted metrics."""
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
        lp, ent, mask = response_logprobs(model, batch, device)
    old = torch.zeros_like(lp)
    for i, s in enumerate(batch):
        old[i, :len(s.old_logprobs)] = torch.tensor(list(s.old_logprobs))
    adv = torch.tensor([s.advantage for s in batch], device=device)
    loss, m = policy_loss(lp, old, adv, mask, cfg.loss, entropy=ent)
    (loss * share).backward()
    return {k: m[k] * share for k in METRIC_KEYS}


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
    norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)
    # Under FSDP the norm is a replicated DTensor, already reduced over every rank's shards.
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _mini_batch(model, samples: Sequence[TrainSample], mini: Sequence[int], cfg: UpdateConfig, device: str,
                adapter, sharded: bool) -> dict[str, float]:
    """Accumulate this rank's gradients for one mini-batch; returns its share-weighted metrics."""
    rank, world_size = world()
    total = sum(len(samples[r].response_ids) for r in mini)
    stats = dict.fromkeys(METRIC_KEYS, 0.0)
    for micro, weight in _plan(mini, samples, cfg, adapter is not None, rank, world_size, sharded):
        batch = [samples[r] for r in micro]
        share = weight * sum(len(s.response_ids) for s in batch) / total
        with adapter(batch[0].agent) if adapter else contextlib.nullcontext():
            for k, v in _micro_step(model, batch, cfg, device, share).items():
                stats[k] += v
    return stats


def update(model, optimizer: torch.optim.Optimizer, samples: Sequence[TrainSample], cfg: UpdateConfig, *,
           params: Sequence[torch.nn.Parameter], device: str = "cpu",
           adapter: Callable[[str], contextlib.AbstractContextManager] | None = None,
           generator: torch.Generator | None = None) -> dict[str, float]:
    """Run the update; returns averaged metrics. `adapter(agent)` activates an agent's LoRA
    adapter (None: one shared model). `generator` seeds the mini-batch order (exact resume).

    Under torch.distributed every rank gets the same samples and generator seed and works on its
    share of each mini-batch (rows rank::world). Replicated (ddp): gradients are summed by
    all-reduce before each step. Sharded (an FSDP2 `model`, see sharding.py): FSDP sums them
    by reduce-scatter in every backward, and each rank steps its own shard. Either way the
    result is the single-process one whatever the world size."""
    world_size = world()[1]
    sharded = is_sharded(model)
    stats = dict.fromkeys((*METRIC_KEYS, "grad_norm"), 0.0)
    steps = 0
    model.train()
    for _ in range(cfg.epochs):
        order = torch.randperm(len(samples), generator=generator).tolist()
        for start in range(0, len(order), cfg.mini_batch_size):
            optimizer.zero_grad(set_to_none=True)
            step = _mini_batch(model, samples, order[start:start + cfg.mini_batch_size], cfg, device, adapter, sharded)
            if world_size > 1:
                _sum_over_ranks(step)
                if not sharded:
                    _all_reduce_grads(params)
            for k, v in step.items():
                stats[k] += v
            stats["grad_norm"] += _clip(params, cfg.grad_clip)
            optimizer.step()
            steps += 1
    return {k: v / max(steps, 1) for k, v in stats.items()} | {"optimizer_steps": float(steps)}

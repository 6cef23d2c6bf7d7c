"""One AT-GRPO update of a pool's model from a step's samples (plain logic, no gRPC).

Samples are validated whole before anything trains. Each of `epochs` passes walks the samples in
mini-batches (one optimizer step each); a mini-batch is split into micro-batches by a token
budget (packed by length, trainer_svc.packing), and every micro-batch's loss is weighted by its
share of the mini-batch's tokens, so the
gradient is the token-mean over the whole mini-batch whatever the micro-batching (1 x 8 equals
8 x 1). On a LoRA pool each agent's policy updates on its own, as the paper's per-agent
updates do: an agent's mini-batches hold only its samples, run with its adapter active, are a
token-mean over its own tokens and clip its adapter's gradient by its own norm, so an agent's
samples update only its adapter and never scale another agent's step.

With kl_coef > 0 every micro-batch is also scored by the frozen reference (no gradient) and the
loss adds kl_coef x the token-mean k3 KL to it (atgrpo.algo.loss).

The PPO ratio's old log-probs are the trainer's own (issue 59): the rollout engine scores tokens
with other kernels and precision, so its log-probs are not the trainer's even at the same
weights. Before the first optimizer step every sample is scored by the weights as they are (no
gradient; when the update is one optimizer step its training forwards are that scoring, and no
extra pass runs): the proximal policy, on-policy the trainer's behaviour policy. The update
trains with the decoupled loss, whose trust region is around those log-probs and whose truncated
importance weight min(exp(trainer - engine), behav_imp_cap) corrects from the engine's
(atgrpo.algo.loss.decoupled_policy_loss); the same weight corrects for stale samples
(asynchronous training, max_staleness > 0: samples may come from weights up to max_staleness
versions behind). The update reports the mismatch (trainer_svc.behaviour). With behav_imp_cap 0
and max_staleness 0 none of this runs: the ratio sits on the engine's log-probs.

On a pool spread over several ranks (torchrun; see sharding.py and distributed.py) every rank
runs `update` on the same samples at once and takes its share of each mini-batch; the gradients
are summed across ranks (all-reduce when replicated, FSDP's reduce-scatter when sharded), so the
update equals the single-process one.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Collection, Sequence
from dataclasses import replace

import torch

from atgrpo.algo.registry import PolicyLoss, policy_loss_named
from atgrpo.contract.trainer import TrainSample, UpdateConfig
from atgrpo.errors import InvalidArgument
from trainer_svc.behaviour import mismatch_figures, settle
from trainer_svc.logprobs import response_logprobs
from trainer_svc.packing import by_prompt, pack
from trainer_svc.update_context import (
    DEFAULT_SETTINGS,
    Adapter,
    Proximal,
    Reference,
    TrainerUpdateSettings,
    UpdateClock,
    UpdateContext,
    padded,
    shares_prompts,
)

METRIC_KEYS = ("loss", "clip_fraction", "approx_kl", "entropy")
# The decoupled loss's own figures (scores_own), averaged like the others.
DECOUPLED_KEYS = (
    "behav_approx_kl",
    "behav_imp_weight_mean",
    "behav_imp_weight_max",
    "behav_capped_fraction",
)


def validate(
    samples: Sequence[TrainSample], agents: Sequence[str], max_tokens: int | None = None
) -> None:
    """InvalidArgument naming the first bad sample; nothing trains from a bad request.
    `max_tokens`: the micro-batch budget; a longer sample cannot fit in memory as configured."""
    if not samples:
        raise InvalidArgument("no samples to train on")
    for i, s in enumerate(samples):
        where = f"sample {i} (agent {s.agent!r})"
        if s.agent not in agents:
            raise InvalidArgument(
                f"{where}: this pool trains {list(agents)}, not {s.agent!r}; route it to its pool"
            )
        if not s.response_ids:
            raise InvalidArgument(f"{where}: empty response; drop it before training")
        if not s.prompt_ids:
            raise InvalidArgument(f"{where}: empty prompt")
        if len(s.old_logprobs) != len(s.response_ids):
            raise InvalidArgument(
                f"{where}: {len(s.response_ids)} response tokens but {len(s.old_logprobs)} "
                "log-probs; send one log-prob per token"
            )
        if not math.isfinite(s.advantage):
            raise InvalidArgument(f"{where}: advantage {s.advantage} is not finite")
        # -inf is a token the sampling distribution excludes (the loss leaves it out); NaN and
        # +inf are no log-probability at all.
        if not all(x == -math.inf or math.isfinite(x) for x in s.old_logprobs):
            raise InvalidArgument(
                f"{where}: a log-prob is NaN or +inf; send log-probs <= 0 (-inf allowed)"
            )
        length = len(s.prompt_ids) + len(s.response_ids)
        if max_tokens is not None and length > max_tokens:
            raise InvalidArgument(
                f"{where}: {length} tokens, over the trainer's micro-batch budget of "
                f"{max_tokens}; raise micro_batch_tokens or cap prompts and responses"
            )


def _micro_batches(ctx: UpdateContext, mini: Sequence[int]) -> list[tuple[list[int], float]]:
    """This rank's micro-batches of a mini-batch (rows rank::world), each with a weight: 1, or 0
    for padding. FSDP all-gathers in every forward and reduce-scatters in every backward, so
    under FSDP every rank must run as many micro-batches: one with fewer repeats a real row at
    weight 0 (it adds nothing to the gradient but takes part in the collectives). When the model
    shares prompts (ctx.shared) the rows are ordered by prompt before they are dealt (a group of
    K spreads over the ranks, K / world a rank) and packed by what the shared forward holds."""
    samples, budget, world_size = ctx.samples, ctx.settings.micro_batch_tokens, ctx.world_size
    mini = by_prompt(mini, samples) if ctx.shared else list(mini)
    mine = [(m, 1.0) for m in pack(mini[ctx.rank :: world_size], samples, budget, ctx.shared)]
    if ctx.sharded:
        most = max(
            len(pack(mini[r::world_size], samples, budget, ctx.shared)) for r in range(world_size)
        )
        mine += [([mini[0]], 0.0)] * (most - len(mine))
    return mine


def _old_logprobs(batch: Sequence[TrainSample], like: torch.Tensor) -> torch.Tensor:
    return padded([s.old_logprobs for s in batch], like)


def _autocast(ctx: UpdateContext):
    return torch.autocast(
        ctx.device.split(":")[0], dtype=torch.bfloat16, enabled=ctx.settings.autocast_bf16
    )


def _agent_rows(samples: Sequence[TrainSample]) -> dict[str, list[int]]:
    """Each agent's rows, agents in first-seen order (the same on every rank)."""
    rows: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        rows.setdefault(s.agent, []).append(i)
    return rows


def proximal_logprobs(ctx: UpdateContext, skip: Collection[int] = ()) -> list[torch.Tensor]:
    """Every sample's response log-probs under the weights as they are (the decoupled loss's
    proximal policy), without gradient: one float32 CPU tensor per sample, -inf where the
    sample's transform excludes the token. Rows in `skip` are not scored (zeros): the first
    optimizer step's, whose own forwards give theirs (Proximal.pending). Scored as the update's
    forward scores: per agent with its adapter active (LoRA), in micro-batches of the same
    budget, under the same autocast.

    Under torch.distributed each rank scores its share (rows rank::world of each agent's rows;
    under FSDP padded to the same number of forwards, as _micro_batches does, since every forward
    is a collective) and the ranks sum their disjoint shares, so every rank ends with all of
    them."""
    samples = ctx.samples
    offsets = [0, *itertools.accumulate(len(s.response_ids) for s in samples)]
    flat = torch.zeros(offsets[-1], dtype=torch.float32)
    groups = _agent_rows(samples) if ctx.per_agent else {None: list(range(len(samples)))}
    skip = set(skip)
    for agent, rows in groups.items():
        rows = [r for r in rows if r not in skip]
        if not rows:  # the same on every rank: all of them skip this agent's forwards
            continue
        # no_grad inside the adapter's context: activating an adapter may turn gradients back on.
        with ctx.as_agent(agent), torch.no_grad():
            for micro, weight in _micro_batches(ctx, rows):
                batch = ctx.rows(micro)
                with _autocast(ctx), ctx.timed("forward", batch, grad=False):
                    lp = response_logprobs(ctx.model, batch, ctx.device, with_entropy=False)[0]
                if weight:  # a padding forward (weight 0) repeats a row another rank owns
                    for i, r in enumerate(micro):
                        flat[offsets[r] : offsets[r + 1]] = (
                            lp[i, : offsets[r + 1] - offsets[r]].float().cpu()
                        )
    if ctx.world_size > 1:
        torch.distributed.all_reduce(flat)
    return [flat[offsets[r] : offsets[r + 1]] for r in range(len(samples))]


def _micro_step(ctx: UpdateContext, micro: Sequence[int], share: float) -> dict[str, float]:
    """Forward and backward of the micro-batch of rows `micro`, its loss scaled by `share` (its
    part of the mini-batch's tokens); returns its share-weighted metrics and its masked-token
    count."""
    cfg, device, batch = ctx.cfg, ctx.device, ctx.rows(micro)
    with _autocast(ctx):
        # The entropy carries a gradient only as a bonus; otherwise it is a metric.
        with ctx.timed("forward", batch):
            lp, ent, mask = response_logprobs(
                ctx.model, batch, device, entropy_grad=bool(cfg.loss.entropy_coef)
            )
        ref = None
        if cfg.loss.kl_coef and ctx.reference is not None:
            with (
                torch.no_grad(),
                ctx.reference() as ref_model,
                ctx.timed("forward", batch, grad=False),
            ):
                ref = response_logprobs(ref_model, batch, device, with_entropy=False)[0]
    adv = torch.tensor([s.advantage for s in batch], device=device)
    old = _old_logprobs(batch, lp)  # the sampler's (behaviour) policy's
    loss_fn = loss_for(cfg)
    if ctx.proximal is not None:
        prox_lp = ctx.proximal.logprobs(micro, lp)
        if share:  # a padding forward (share 0) repeats a row another rank owns
            ctx.proximal.keep(micro, prox_lp, [len(s.response_ids) for s in batch])
    else:  # the correction off: the engine's log-probs stand for the trainer's
        prox_lp = old if loss_fn.proximal else None
    loss, m = loss_fn.fn(
        lp, old, adv, mask, cfg.loss, prox_logprobs=prox_lp, ref_logprobs=ref, entropy=ent
    )
    with ctx.timed("backward"):
        (loss * share).backward()
    # A registered loss reports what it can; the keys it lacks are left out of the step's metrics.
    return {k: m[k] * share for k in _mean_keys(cfg) if k in m} | {
        "masked_tokens": m["masked_tokens"]
    }


def loss_for(cfg: UpdateConfig) -> PolicyLoss:
    """The registered policy loss the update trains with (UpdateConfig.policy_loss)."""
    return policy_loss_named(cfg.policy_loss)


def scores_own(cfg: UpdateConfig) -> bool:
    """Whether the update scores the trainer's own log-probs for the ratio: asked for
    (behav_imp_cap > 0 or max_staleness > 0) and taken by the loss (proximal=True)."""
    return cfg.trainer_logprobs and loss_for(cfg).proximal


def _mean_keys(cfg: UpdateConfig) -> tuple[str, ...]:
    keys = (*METRIC_KEYS, "kl_ref") if cfg.loss.kl_coef else METRIC_KEYS
    return (*keys, *DECOUPLED_KEYS) if scores_own(cfg) else keys


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


def _mini_batch(ctx: UpdateContext, agent: str | None, mini: Sequence[int]) -> dict[str, float]:
    """Accumulate this rank's gradients for the mini-batch of rows `mini` (of one agent when
    `agent` is set, with its adapter active); returns its share-weighted metrics."""
    total = sum(len(ctx.samples[r].response_ids) for r in mini)
    stats = dict.fromkeys((*_mean_keys(ctx.cfg), "masked_tokens"), 0.0)
    for micro, weight in _micro_batches(ctx, mini):
        share = weight * sum(len(s.response_ids) for s in ctx.rows(micro)) / total
        with ctx.as_agent(agent):
            for k, v in _micro_step(ctx, micro, share).items():
                # padding rows count no tokens
                stats[k] += v * weight if k == "masked_tokens" else v
    return stats


def _agent_order(seed: int, agent: str, n: int) -> list[int]:
    """An agent's own shuffle: from one draw of the pool's generator and the agent's name, so it
    does not depend on how many samples the other agents had."""
    generator = torch.Generator().manual_seed((seed + zlib.crc32(agent.encode())) % 2**63)
    return torch.randperm(n, generator=generator).tolist()


def steps_of_epoch(
    samples: Sequence[TrainSample],
    mini_batch_size: int,
    per_agent: bool,
    generator: torch.Generator | None,
) -> list[list[tuple[str | None, list[int]]]]:
    """Each optimizer step of one epoch as its clip groups: (agent, rows) pairs.

    One shared model: one group (agent None) per step, `mini_batch_size` rows of one shuffle of
    all samples. Per-agent adapters (LoRA) update each agent's policy on its own: each agent's
    rows are shuffled apart, step i holds the i-th mini-batch of every agent that has one, and
    each group's loss is a token-mean over its own tokens and clipped on its own, so one agent's
    samples never change another agent's step."""
    if not per_agent:
        order = torch.randperm(len(samples), generator=generator).tolist()
        return [
            [(None, order[i : i + mini_batch_size])] for i in range(0, len(order), mini_batch_size)
        ]
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    rows = _agent_rows(samples)
    minis = {
        a: [
            [r[j] for j in _agent_order(seed, a, len(r))][i : i + mini_batch_size]
            for i in range(0, len(r), mini_batch_size)
        ]
        for a, r in rows.items()
    }
    steps = max(len(m) for m in minis.values())
    return [[(a, m[i]) for a, m in minis.items() if i < len(m)] for i in range(steps)]


def first_step_rows(plan: list[list[tuple[str | None, list[int]]]]) -> set[int]:
    """The rows of an epoch's first optimizer step (every clip group's): their training forwards
    run on the weights the update starts from, so the proximal pass need not score them."""
    return {r for _, rows in plan[0] for r in rows}


def one_step(samples: Sequence[TrainSample], cfg: UpdateConfig, per_agent: bool) -> bool:
    """Whether the update is a single optimizer step: one epoch, and every sample (each agent's,
    on a LoRA pool) in one mini-batch."""
    if cfg.epochs != 1:
        return False
    counts = [len(r) for r in _agent_rows(samples).values()] if per_agent else [len(samples)]
    return max(counts) <= cfg.mini_batch_size


def adapter_params(model, agent: str) -> list[torch.nn.Parameter]:
    """The trainable parameters of `agent`'s LoRA adapter (PEFT names them lora_X.<adapter>)."""
    return [p for n, p in model.named_parameters() if "lora_" in n and f".{agent}." in n]


def update(
    model,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TrainSample],
    cfg: UpdateConfig,
    *,
    params: Sequence[torch.nn.Parameter],
    settings: TrainerUpdateSettings = DEFAULT_SETTINGS,
    device: str = "cpu",
    adapter: Adapter | None = None,
    generator: torch.Generator | None = None,
    reference: Reference | None = None,
) -> dict[str, float]:
    """Run the update; returns averaged metrics (per agent of a LoRA pool also `grad_norm/<agent>`).
    `cfg`: the router's settings of this step; `settings`: the trainer's own. `adapter(agent)`
    activates an agent's LoRA adapter (None: one shared model). `generator` seeds the mini-batch
    order (exact resume). `reference()` gives the frozen reference model for the KL term (used
    only when kl_coef > 0). With behav_imp_cap > 0 or max_staleness > 0 every sample's
    proximal log-probs are scored first (proximal_logprobs; by the training forwards when the
    update is one optimizer step), the update trains with the decoupled loss and reports the
    engine/trainer mismatch (mismatch_*, trainer_svc.behaviour); with both 0 the ratio sits on
    the engine's log-probs.

    Under torch.distributed every rank gets the same samples and generator seed and works on its
    share of each mini-batch (rows rank::world). Replicated (ddp): gradients are summed by
    all-reduce before each step. Sharded (an FSDP2 `model`, see sharding.py): FSDP sums them
    by reduce-scatter in every backward, and each rank steps its own shard. Either way the
    result is the single-process one whatever the world size."""
    if cfg.loss.kl_coef and reference is None:
        raise ValueError("kl_coef > 0 needs the frozen reference: pass reference=")
    model.train()
    clock = UpdateClock(device, shares_prompts(model))
    ctx = UpdateContext(model, samples, cfg, settings, device, adapter, reference, clock)
    plan = steps_of_epoch(samples, cfg.mini_batch_size, ctx.per_agent, generator)  # epoch 0
    # Before any step: the proximal policy is the weights this update starts from, for every epoch.
    if scores_own(cfg):
        if one_step(samples, cfg, ctx.per_agent):
            ctx = replace(ctx, proximal=Proximal(None))
        else:
            first = first_step_rows(plan)
            scored = proximal_logprobs(ctx, skip=first)
            ctx = replace(ctx, proximal=Proximal(scored, pending=set(first)))
    stats: dict[str, float] = dict.fromkeys((*_mean_keys(cfg), "grad_norm", "masked_tokens"), 0.0)
    norms: dict[str, list[float]] = {}
    groups = steps = 0
    for epoch in range(cfg.epochs):
        if epoch:
            plan = steps_of_epoch(samples, cfg.mini_batch_size, ctx.per_agent, generator)
        for step in plan:
            parts, step_norms = _optimizer_step(ctx, optimizer, params, step)
            settle(ctx)  # after the first step: its rows' proximal log-probs, for the rest
            for key, v in parts.items():
                stats[key.split("/", 1)[1]] += v
            for agent, norm in step_norms:
                norms.setdefault(agent or "", []).append(norm)
                stats["grad_norm"] += norm
            groups += len(step)
            steps += 1
    # masked_tokens: of the samples (each epoch sees them again); the rest: means over the groups.
    out = {
        k: v / cfg.epochs if k == "masked_tokens" else v / max(groups, 1) for k, v in stats.items()
    }
    per_agent = {f"grad_norm/{a}": sum(n) / len(n) for a, n in norms.items() if a}
    figures = mismatch_figures(ctx)
    return out | per_agent | figures | {"optimizer_steps": float(steps)} | clock.report(model)


def _optimizer_step(
    ctx: UpdateContext,
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    step: list[tuple[str | None, list[int]]],
) -> tuple[dict[str, float], list[tuple[str | None, float]]]:
    """One optimizer step over its clip groups (steps_of_epoch): each group's metrics, keyed
    "<group>/<metric>" and summed over the ranks, and each group's (agent, gradient norm)."""
    optimizer.zero_grad(set_to_none=True)
    parts = {
        f"{i}/{k}": v
        for i, (agent, rows) in enumerate(step)
        for k, v in _mini_batch(ctx, agent, rows).items()
    }
    if ctx.world_size > 1:
        _sum_over_ranks(parts)
        if not ctx.sharded:
            _all_reduce_grads(params)
    norms = []
    for agent, _ in step:
        with ctx.timed("optimizer"):
            group = params if agent is None else adapter_params(ctx.model, agent)
            norms.append((agent, _clip(group, ctx.settings.grad_clip)))
    with ctx.timed("optimizer"):
        optimizer.step()
    return parts, norms

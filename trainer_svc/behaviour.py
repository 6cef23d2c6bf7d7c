"""The rollout/training mismatch of one update, measured over all of its samples (issue 59).

The trainer's behaviour log-probs (UpdateContext.proximal) are scored once per update: by the
proximal pass before the first optimizer step, or, when the update is one optimizer step, by the
training forwards themselves (Proximal.keep). Either way every response token has one, and the
figures (atgrpo.algo.mismatch.mismatch_metrics) are computed once over the whole update, so the
quantiles are the update's, not a mean of micro-batch quantiles.
"""

from __future__ import annotations

import itertools

import torch

from atgrpo.algo.mismatch import mismatch_metrics
from trainer_svc.update_context import Proximal, UpdateContext


def trainer_logprobs(ctx: UpdateContext, proximal: Proximal) -> torch.Tensor:
    """Every response token's trainer log-prob, flat in sample order (float32, CPU). From the
    training forwards (a one-step update), each rank holds its own rows: the ranks sum their
    disjoint shares, a collective every rank reaches at the end of the update."""
    samples = ctx.samples
    if proximal.scored is not None:
        return torch.cat([t.float() for t in proximal.scored])
    offsets = [0, *itertools.accumulate(len(s.response_ids) for s in samples)]
    flat = torch.zeros(offsets[-1], dtype=torch.float32)
    for r, lp in proximal.seen.items():
        flat[offsets[r] : offsets[r + 1]] = lp
    if ctx.world_size > 1:
        # -inf + 0 from the other ranks stays -inf: a token outside the support survives the sum.
        torch.distributed.all_reduce(flat)
    return flat


def mismatch_figures(ctx: UpdateContext) -> dict[str, float]:
    """The update's mismatch figures (mismatch_kl, mismatch_outside_support, mismatch_ratio_p05,
    _p50, _p95, mismatch_capped_fraction) between the engine's log-probs and the trainer's; {}
    when the trainer did not score its own (behav_imp_cap 0 on-policy, or a loss that takes no
    proximal log-probs)."""
    if ctx.proximal is None:
        return {}
    trainer = trainer_logprobs(ctx, ctx.proximal)
    engine = torch.tensor(
        [x for s in ctx.samples for x in s.old_logprobs], dtype=torch.float32
    )  # (tokens,)
    return mismatch_metrics(trainer, engine, ctx.cfg.loss.behav_imp_cap)

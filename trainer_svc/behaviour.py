"""The rollout/training mismatch of one update, measured over all of its samples (issue 59).

The trainer's behaviour log-probs (UpdateContext.proximal) are scored once per update: the first
optimizer step's rows by its own training forwards (Proximal.keep; settle gathers them from every
rank after that step), the other rows by the proximal pass before it. Either way every response
token has one, and the
figures (atgrpo.algo.mismatch.mismatch_metrics) are computed once over the whole update, so the
quantiles are the update's, not a mean of micro-batch quantiles.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from atgrpo.algo.mismatch import mismatch_metrics
from trainer_svc.update_context import Proximal, UpdateContext


def trainer_logprobs(ctx: UpdateContext, proximal: Proximal) -> torch.Tensor:
    """Every response token's trainer log-prob, flat in sample order (float32, CPU)."""
    if proximal.scored is not None:  # settled after the first step
        return torch.cat([t.float() for t in proximal.scored])
    return torch.cat(_gather(ctx, proximal, range(len(ctx.samples))))


def _gather(ctx: UpdateContext, proximal: Proximal, rows: Sequence[int]) -> list[torch.Tensor]:
    """Rows `rows`' log-probs from the training forwards, each rank holding its own: the ranks
    sum their disjoint shares, a collective every rank reaches (-inf + 0 stays -inf)."""
    lengths = [len(ctx.samples[r].response_ids) for r in rows]
    offsets = [0, *itertools.accumulate(lengths)]
    flat = torch.zeros(offsets[-1], dtype=torch.float32)
    for j, r in enumerate(rows):
        if r in proximal.seen:
            flat[offsets[j] : offsets[j + 1]] = proximal.seen[r]
    if ctx.world_size > 1:
        torch.distributed.all_reduce(flat)
    return [flat[offsets[j] : offsets[j + 1]] for j in range(len(rows))]


def settle(ctx: UpdateContext) -> None:
    """After the first optimizer step: its rows' log-probs, from the training forwards of every
    rank, into Proximal.scored for the later steps and epochs (a row may be another rank's then).
    Every rank calls it after every step; all but the first do nothing."""
    proximal = ctx.proximal
    if proximal is None or proximal.scored is None or not proximal.pending:
        return
    rows = sorted(proximal.pending)
    for r, lp in zip(rows, _gather(ctx, proximal, rows), strict=True):
        proximal.scored[r] = lp
    proximal.pending.clear()
    proximal.seen.clear()


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

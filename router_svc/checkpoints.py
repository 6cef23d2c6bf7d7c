"""Which checkpoints a run keeps on disk (run.keep_checkpoints): a pure rule, so the router's
pruning is tested with hand-made checkpoint lists.

A full bf16 Qwen3-8B checkpoint is 115 GB: a 200-step run checkpointing every 10 steps would
write 2.3 TB. The router keeps the last `keep` and the best by eval success, and deletes the rest
once a newer checkpoint is complete and recorded in state.json.
"""

from __future__ import annotations

from collections.abc import Sequence

from atgrpo.rundir import Checkpoint


def best(checkpoints: Sequence[Checkpoint]) -> Checkpoint | None:
    """The checkpoint with the highest eval success among those taken at an evaluated step; the
    latest of equals (it is likelier to be kept anyway, and it trained longer)."""
    rated = [c for c in checkpoints if c.success is not None]
    return max(rated, key=lambda c: (c.success, c.step)) if rated else None


def retained(checkpoints: Sequence[Checkpoint], keep: int) -> list[Checkpoint]:
    """The checkpoints to keep, oldest first: the last `keep` by step (the last is what a resume
    loads), plus the best by eval success; every one when keep is 0."""
    ordered = sorted(checkpoints, key=lambda c: c.step)
    if keep <= 0:
        return ordered
    kept = ordered[-keep:]
    top = best(ordered)
    if top is not None and top not in kept:
        kept = sorted([*kept, top], key=lambda c: c.step)
    return kept

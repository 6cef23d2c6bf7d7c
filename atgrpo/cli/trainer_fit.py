"""Where a pool's trainer fits (atgrpo plan, through atgrpo.cli.sizing): whether it fits a number
of GPUs of a given memory, the nodes that many GPUs span as the chart places them, the fewest GPUs
of one node it fits, and each single config change that would make it fit. Each answer re-runs
atgrpo.memory's estimate of the trainer's peak; this module is the search around it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from atgrpo.memory import (
    checkpointing_on,
    longest_sample,
    trainer_components,
    trainer_peak,
    usable,
)
from atgrpo.model_shape import ModelShape

if TYPE_CHECKING:
    from atgrpo.config import PoolConfig, RunConfig


# GPUs of one node, as the chart's gpu.perNode assumes by default: a trainer with more spans nodes.
GPUS_PER_NODE = 8


def sorts_vocabulary(cfg: RunConfig, pool: str) -> bool:
    """Whether an agent of `pool` trains under top-p without top-k: its log-prob passes sort the
    vocabulary (more temporaries a pass)."""
    return any(
        0 < s.top_p < 1 and s.top_k <= 0
        for s in (cfg.agents[a].train_sampling for a in cfg.agents_of(pool))
    )


def one_node_ranks(
    cfg: RunConfig, name: str, pool: PoolConfig, shape: ModelShape, memory: int, per_node: int
) -> int | None:
    """The fewest GPUs of one node the trainer fits on, or None: a pool that fits one node trains
    faster there than spread over several (hybrid sharding still all-reduces across them)."""
    return next(
        (n for n in range(1, per_node + 1) if trainer_fits(cfg, name, pool, shape, memory, n)), None
    )


def node_layout(name: str, ranks: int, per_node: int) -> tuple[int, str | None]:
    """The nodes a trainer of `ranks` GPUs spans, as the chart places it (gpu.perNode GPUs a
    node): 1 up to a node's GPUs, else ranks / per_node, which must divide evenly."""
    if ranks <= per_node:
        return 1, None
    if ranks % per_node:
        low, high = ranks // per_node * per_node, (ranks // per_node + 1) * per_node
        return 0, (
            f"pools.{name}.trainer_gpus is {ranks}, more than a node's {per_node} GPUs and not a "
            f"multiple of them: a trainer past one node runs {per_node} ranks on each (the chart's "
            f"gpu.perNode, `atgrpo plan --gpus-per-node`). Use trainer_gpus: {low} or {high}"
        )
    return ranks // per_node, None


def trainer_fits(
    cfg: RunConfig,
    name: str,
    pool: PoolConfig,
    shape: ModelShape,
    memory: int,
    ranks: int,
    tokens: int | None = None,
) -> bool:
    """Whether the pool's trainer, as `pool` sets it, fits `ranks` GPUs of `memory` bytes."""
    tokens = max(tokens or pool.micro_batch_tokens, longest_sample(cfg, name))
    return trainer_peak(
        trainer_components(
            shape,
            pool,
            cfg.algorithm,
            "cuda",
            agents=len(cfg.agents_of(name)),
            ranks=ranks,
            tokens=tokens,
            memory=memory,
            sorts=sorts_vocabulary(cfg, name),
        )
    ) <= usable(memory)


def trainer_fixes(
    cfg: RunConfig,
    name: str,
    pool: PoolConfig,
    shape: ModelShape,
    ranks: int,
    memory: int,
    per_node: int = GPUS_PER_NODE,
) -> list[str]:
    """Each single change that would make the pool's trainer fit, found by re-running the
    estimate."""
    sample = longest_sample(cfg, name)

    def fits(p: PoolConfig, n: int = ranks, tokens: int | None = None) -> bool:
        return trainer_fits(cfg, name, p, shape, memory, n, tokens)

    fixes = []
    if not checkpointing_on(pool, "cuda") and fits(replace(pool, gradient_checkpointing=True)):
        fixes.append(f"turn checkpointing on: pools.{name}.gradient_checkpointing: true")
    fit_tokens = _largest_fitting(lambda t: fits(pool, tokens=t), sample, pool.micro_batch_tokens)
    if fit_tokens:
        fixes.append(f"fewer micro-batch tokens: pools.{name}.micro_batch_tokens: {fit_tokens}")
    if pool.specialization == "full":
        # counts a cluster can place: up to a node's GPUs, then whole nodes
        placeable = (n for n in range(ranks + 1, 65) if n <= per_node or n % per_node == 0)
        more = next((n for n in placeable if fits(pool, n=n)), None)
        if more:
            fixes.append(
                f"more GPUs: pools.{name}.trainer_gpus: {more} (FSDP shards the model and "
                f"optimizer over them; or `atgrpo plan --gpus {more}`)"
            )
        from atgrpo.config import LoraConfig

        if fits(replace(pool, specialization="lora", lora=LoraConfig())):
            fixes.append(
                f"LoRA: pools.{name}.specialization: lora (the base stays frozen in 16 bits; "
                "only the adapters train)"
            )
    if not fixes:
        fixes.append("a GPU with more memory (--gpu-memory), or a smaller model")
    return fixes


def _largest_fitting(ok: Any, low: int, high: int) -> int | None:
    """The largest multiple of 1024 in [low, high) for which ok() holds (ok is monotone)."""
    if not ok(low):
        return None
    lo, hi = low, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    best = lo // 1024 * 1024
    return best if best >= low else lo

"""Local mode on a GPU machine: which GPUs each process gets, and how much of a shared GPU an engine
may take.

Every GPU process gets its own GPUs through CUDA_VISIBLE_DEVICES: a trainer one (local mode starts
one trainer process a pool), a rollout replica pools.<name>.rollout_gpus. With fewer GPUs than that
the processes share them, assigned round-robin in the plan's order (each pool's trainer, then its
replicas). Left alone on a shared GPU, vLLM takes 92% of it and the trainer beside it runs out of
memory; so an engine there gets a gpu_memory_utilization that leaves the others what `atgrpo plan`
estimates for them, or the launch is refused with the fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from atgrpo.cli.sizing import ProcessSizing, gib, size_run
from atgrpo.config import RunConfig
from atgrpo.memory import usable


class PlacementError(ValueError):
    """The processes cannot share the visible GPUs; the message says what to change."""


@dataclass(frozen=True)
class Placement:
    devices: dict[str, str] = field(default_factory=dict)  # process -> its CUDA_VISIBLE_DEVICES
    # vLLM replica -> its fraction
    memory_utilization: dict[str, float] = field(default_factory=dict)


def place(cfg: RunConfig, ids: Sequence[str], gpu_memory: int) -> Placement:
    """GPUs for each of `cfg`'s local GPU processes, out of the visible `ids` (each of `gpu_memory`
    bytes). No ids: a CPU run, nothing placed."""
    if not ids:
        cuda = [f"pools.{n}.device" for n, p in cfg.pools.items() if p.device == "cuda"]
        if cuda:
            raise PlacementError(
                f"{', '.join(cuda)} is cuda, but no GPU is visible here. Set device: auto "
                "(cpu when there is no GPU), or run where torch sees a GPU"
            )
        return Placement()
    procs = [
        p for p in size_run(cfg, gpu_memory=gpu_memory, local=True).processes if p.device == "cuda"
    ]
    for p in procs:
        if p.gpus > len(ids):
            raise PlacementError(
                f"{p.name} needs {p.gpus} GPUs (pools.{p.pool}.rollout_gpus), but {len(ids)} "
                f"are visible. Set pools.{p.pool}.rollout_gpus: {len(ids)} or less, or run where "
                f"{p.gpus} are visible"
            )
    on: dict[int, list[ProcessSizing]] = {}
    devices, cursor = {}, 0
    for p in procs:
        mine = [(cursor + k) % len(ids) for k in range(p.gpus)]
        cursor += p.gpus
        devices[p.name] = ",".join(ids[i] for i in mine)
        for i in mine:
            on.setdefault(i, []).append(p)
    fractions = {p.name: f for p in procs if (f := _set_fraction(cfg, p)) is not None}
    for i, sharing in sorted(on.items()):
        if len(sharing) > 1:
            for name, f in _shares(
                cfg, sharing, gpu_memory, f"GPU {ids[i]}", len(procs), len(ids)
            ).items():
                fractions[name] = min(f, fractions.get(name, 1.0))
    return Placement(devices, fractions)


def _set_fraction(cfg: RunConfig, p: ProcessSizing) -> float | None:
    return cfg.pools[p.pool].rollout_gpu_memory_utilization if p.kind == "rollout" else None


def _shares(
    cfg: RunConfig, sharing: list[ProcessSizing], memory: int, gpu: str, count: int, visible: int
) -> dict[str, float]:
    """The vLLM fraction of each engine on one shared GPU: what usable memory the others (trainers,
    transformers replicas, engines with a fraction set) leave, split evenly, rounded down."""
    engines = [p for p in sharing if p.kind == "rollout" and cfg.pools[p.pool].engine == "vllm"]
    free = [p for p in engines if _set_fraction(cfg, p) is None]
    fixed = sum(p.gpu_total for p in sharing if p not in engines)
    fixed += sum(int(_set_fraction(cfg, p) * memory) for p in engines if p not in free)
    left = usable(memory) - fixed
    share = math.floor(max(0, left) / max(1, len(free)) / memory * 100) / 100
    short = [p for p in free if share * memory < p.gpu_total]
    short += [p for p in engines if p not in free and _set_fraction(cfg, p) * memory < p.gpu_total]
    if left < 0 or short:
        raise PlacementError(_refusal(cfg, sharing, memory, gpu, count, visible))
    return {p.name: share for p in free}


def _refusal(
    cfg: RunConfig, sharing: list[ProcessSizing], memory: int, gpu: str, count: int, visible: int
) -> str:
    needs = ", ".join(f"{p.name} {gib(p.gpu_total)}" for p in sharing)
    fixes = [
        f"more GPUs: {count} GPU processes want one each, {visible} visible",
        "fewer processes: lower pools.<name>.rollout_replicas",
    ]
    fixes += [
        f"LoRA: pools.{p.pool}.specialization: lora (a frozen base, no full optimizer state)"
        for p in sharing
        if p.kind == "trainer" and cfg.pools[p.pool].specialization == "full"
    ]
    fixes += [
        "a GPU with more memory",
        *(
            f"set pools.{p.pool}.rollout_gpu_memory_utilization to the share its engine may take"
            for p in sharing
            if p.kind == "rollout" and cfg.pools[p.pool].engine == "vllm"
        ),
    ]
    lines = [
        f"{gpu} would be shared by {needs} (at least, as `atgrpo plan` estimates), but only "
        f"{gib(usable(memory))} of it is usable. Any one of:",
        *(f"  - {f}" for f in dict.fromkeys(fixes)),
    ]
    return "\n".join(lines)


def visible_gpus() -> tuple[list[str], int]:
    """(the ids a child's CUDA_VISIBLE_DEVICES may name, each GPU's memory in bytes): those this
    process sees, so a CUDA_VISIBLE_DEVICES set for `atgrpo train` still bounds its services."""
    # torch only here: a CPU-only command does not pay for its import.
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return [], 0
    parent = [i.strip() for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip()]
    ids = parent[:count] if len(parent) >= count else [str(i) for i in range(count)]
    return ids, min(torch.cuda.get_device_properties(i).total_memory for i in range(count))


def local_placement(
    cfg: RunConfig, probe: Callable[[], tuple[list[str], int]] = visible_gpus
) -> Placement:
    """The placement of `cfg`'s local processes on this machine's GPUs (none for an all-CPU
    config)."""
    if all(p.device == "cpu" for p in cfg.pools.values()):
        return Placement()
    ids, memory = probe()
    return place(cfg, ids, memory)

"""A run's sizing: what every process of a run needs, and whether it fits the GPUs the config is
sized for. The per-process formulas are in atgrpo.memory and atgrpo.memory_rollout; this module
lays out a run's processes (trainers, rollout replicas, the services without a model) and their
disk; atgrpo.cli.fit_report prints them (`atgrpo plan`). Where a trainer fits (how many GPUs, how
many nodes, what would make it fit) is searched in atgrpo.cli.trainer_fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from atgrpo.cli.trainer_fit import (
    GPUS_PER_NODE,
    node_layout,
    one_node_ranks,
    sorts_vocabulary,
    trainer_fixes,
)
from atgrpo.config_parse import parse_bytes
from atgrpo.memory import (
    HOST_BASE_BYTES,
    SERVICE_HOST_BYTES,
    GiB,
    checkpoint_bytes,
    checkpointing_on,
    compute_dtype,
    longest_sample,
    pool_activation_bytes,
    push_bytes,
    trainer_components,
    trainer_host_bytes,
    trainer_peak,
    usable,
)
from atgrpo.memory_rollout import rollout_components, rollout_full_kv_bytes
from atgrpo.model_shape import ModelShape, load_shape

if TYPE_CHECKING:
    from atgrpo.config import PoolConfig, RunConfig, RunSection


# --- the plan of a run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessSizing:
    """One process (a trainer's ranks share one row: each rank needs what the row says)."""

    name: str
    kind: str  # trainer | rollout | env | sandbox | router
    pool: str = ""
    device: str = "cpu"
    gpus: int = 0
    gpu: dict[str, int] = field(default_factory=dict)  # component -> bytes on each of its GPUs
    gpu_memory: int | None = None  # bytes per GPU it is checked against
    host: int = 0
    notes: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()  # what would make it fit (when it does not)

    @property
    def gpu_total(self) -> int:
        return trainer_peak(self.gpu) if self.kind == "trainer" else sum(self.gpu.values())

    @property
    def fits(self) -> bool | None:
        """None: no GPU memory to check against (a CPU process, or none stated)."""
        if self.device != "cuda" or self.gpu_memory is None:
            return None
        return self.gpu_total <= usable(self.gpu_memory)


@dataclass(frozen=True)
class PoolDisk:
    pool: str
    checkpoint: int
    checkpoints: int  # how many a run writes
    push: int
    replicas: int
    at_once: int = 0  # the most on the trainer's volume at one time (checkpoints_at_once)
    pushes_on_disk: int = 0  # pushes a rollout replica holds on disk at once (vLLM: 2 in a swap)

    @property
    def trainer_volume(self) -> int:
        return self.checkpoint * self.at_once

    @property
    def replica_disk(self) -> int:
        return self.push * self.pushes_on_disk


def checkpoint_count(run: RunSection) -> int:
    """Checkpoints a run writes: every checkpoint_every_steps, at the end, and at step 0 if
    asked."""
    every = run.checkpoint_every_steps
    count = (run.steps // every if every else 0) + (0 if every and run.steps % every == 0 else 1)
    return count + (1 if run.checkpoint_at_start else 0)


def checkpoints_at_once(run: RunSection) -> int:
    """The most checkpoints on disk at one time under keep_checkpoints: the kept ones, the best by
    eval success (when evaluation runs) and the new one, complete before older ones are deleted."""
    count = checkpoint_count(run)
    if not run.keep_checkpoints or count <= run.keep_checkpoints:
        return count
    return min(count, run.keep_checkpoints + (1 if run.eval_every_steps else 0) + 1)


@dataclass(frozen=True)
class RunSizing:
    source: str
    processes: tuple[ProcessSizing, ...]
    disk: tuple[PoolDisk, ...]
    problems: tuple[str, ...]  # config-level reasons the run cannot go as written
    unplanned: tuple[str, ...] = ()  # GPU pools with no model config to plan from

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.fits is not False for p in self.processes)


def pool_device(pool: PoolConfig, gpu_memory: int | None) -> str:
    """cuda or cpu as planned: `auto` counts as cuda when GPU memory is stated for it."""
    if pool.device == "auto":
        return "cuda" if gpu_memory is not None else "cpu"
    return pool.device


def size_run(
    cfg: RunConfig,
    *,
    gpus: int | None = None,
    gpu_memory: int | None = None,
    source: str = "",
    local: bool = False,
    gpus_per_node: int = GPUS_PER_NODE,
) -> RunSizing:
    """Every process `cfg` starts, with what it needs. `gpus` / `gpu_memory` override each pool's
    trainer_gpus / gpu_memory. `local`: plan what local mode starts (one trainer process a pool).
    A trainer of more than `gpus_per_node` GPUs spans nodes, as the chart places it."""
    processes: list[ProcessSizing] = []
    disks: list[PoolDisk] = []
    problems: list[str] = []
    unplanned: list[str] = []
    for name, pool in cfg.pools.items():
        memory = (
            gpu_memory
            if gpu_memory is not None
            else parse_bytes(pool.gpu_memory)
            if pool.gpu_memory
            else None
        )
        device = pool_device(pool, memory)
        ranks = gpus if gpus is not None else pool.trainer_gpus
        if local and device == "cuda" and pool.trainable and ranks > 1:
            problems.append(
                f"pools.{name}.trainer_gpus is {ranks}, but local mode starts one trainer process "
                f"per pool. Start the services on a cluster (Helm chart: "
                f"pools.{name}.trainer.gpus: {ranks}) and run "
                "`atgrpo train --connect`, or size the pool for one GPU"
            )
            ranks = 1
        shape = load_shape(pool.model_path)
        if shape is None:
            if device == "cuda":
                unplanned.append(
                    f"pools.{name}.model_path: no config.json at {pool.model_path!r} and none "
                    f"carried for a model named {Path(pool.model_path).name!r} "
                    f"(atgrpo/models/configs/). Put the model there, or its "
                    "config.json alone (architecture only) to plan without the weights"
                )
            continue
        if problem := tensor_parallel_problem(name, pool, shape):
            problems.append(problem)
        pool_rows = _rollout_processes(cfg, name, pool, shape, device, memory)
        if pool.trainable:  # its row first
            trainer = _trainer_process(cfg, name, pool, shape, device, ranks, memory, gpus_per_node)
            pool_rows = [trainer, *pool_rows]
        if device == "cuda" and pool.trainable:
            nodes, problem = node_layout(name, ranks, gpus_per_node)
            problems += [problem] if problem else []
            if nodes > 1:
                note = (
                    f"{nodes} nodes x {gpus_per_node} GPUs: the chart runs it as a "
                    "LeaderWorkerSet, its checkpoints on a ReadWriteMany volume"
                )
                if one := one_node_ranks(cfg, name, pool, shape, memory, gpus_per_node):
                    note += (
                        f"; it also fits one node: prefer pools.{name}.trainer_gpus: {one} "
                        "(every collective then stays inside the node, none crosses the network)"
                    )
                pool_rows = [
                    replace(p, notes=(*p.notes, note)) if p.kind == "trainer" else p
                    for p in pool_rows
                ]
        processes += pool_rows
        agents = len(cfg.agents_of(name))
        if pool.trainable:
            # vLLM reloads a full pool from a file: the served one and the incoming push, in a swap.
            on_disk = 2 if pool.engine == "vllm" and pool.specialization == "full" else 0
            disks.append(
                PoolDisk(
                    name,
                    checkpoint_bytes(shape, pool, agents=agents),
                    checkpoint_count(cfg.run),
                    push_bytes(shape, pool, agents=agents),
                    pool.rollout_replicas,
                    checkpoints_at_once(cfg.run),
                    on_disk,
                )
            )
    processes += [
        ProcessSizing(kind, kind, host=SERVICE_HOST_BYTES[kind])
        for kind in ("env", "sandbox", "router")
    ]
    return RunSizing(source, tuple(processes), tuple(disks), tuple(problems), tuple(unplanned))


def tensor_parallel_problem(name: str, pool: PoolConfig, shape: ModelShape) -> str | None:
    """vLLM splits attention heads over its tensor-parallel GPUs: each must get whole query heads,
    and whole KV heads or copies of one (the check vLLM makes when it starts, minutes in)."""
    tp = pool.rollout_gpus
    if pool.engine != "vllm" or tp <= 1:
        return None
    kv_ok = shape.kv_heads % tp == 0 if shape.kv_heads >= tp else tp % shape.kv_heads == 0
    if shape.heads % tp == 0 and kv_ok:
        return None
    fits = [
        n
        for n in range(1, tp)
        if shape.heads % n == 0
        and (shape.kv_heads % n == 0 if shape.kv_heads >= n else n % shape.kv_heads == 0)
    ]
    return (
        f"pools.{name}.rollout_gpus is {tp}, but the model's {shape.heads} attention heads and "
        f"{shape.kv_heads} KV heads do not split evenly over {tp} GPUs (vLLM would refuse it at "
        f"start). Use rollout_gpus: {fits[-1]}, or another count that divides them"
    )


def _model_process(
    name: str,
    kind: str,
    pool: str,
    device: str,
    gpus: int,
    gpu: dict[str, int],
    memory: int | None,
    host: int,
    notes: tuple[str, ...] = (),
) -> ProcessSizing:
    """A trainer's or a rollout replica's row: on CPU it holds no GPU and is checked against no GPU
    memory."""
    cuda = device == "cuda"
    return ProcessSizing(
        name, kind, pool, device, gpus if cuda else 0, gpu, memory if cuda else None, host, notes
    )


def _trainer_process(
    cfg: RunConfig,
    name: str,
    pool: PoolConfig,
    shape: ModelShape,
    device: str,
    ranks: int,
    memory: int | None,
    per_node: int,
) -> ProcessSizing:
    """The pool's trainer: one row for all its ranks, each of which needs what the row says."""
    sample = longest_sample(cfg, name)
    tokens = max(pool.micro_batch_tokens, sample)  # a sample longer than the budget goes alone
    comps = trainer_components(
        shape,
        pool,
        cfg.algorithm,
        device,
        agents=len(cfg.agents_of(name)),
        ranks=ranks,
        tokens=tokens,
        memory=memory,
        sorts=sorts_vocabulary(cfg, name),
    )
    # on CPU the device memory is the host's
    host = (
        trainer_host_bytes(shape, pool, ranks=ranks)
        if device == "cuda"
        else HOST_BASE_BYTES + trainer_peak(comps)
    )
    notes = _trainer_notes(pool, shape, device, comps, tokens, sample)
    plan = _model_process(
        f"trainer-{name}", "trainer", name, device, ranks, comps, memory, host, notes
    )
    if plan.fits is False:
        plan = replace(
            plan, fixes=tuple(trainer_fixes(cfg, name, pool, shape, ranks, memory, per_node))
        )
    return plan


def _trainer_notes(
    pool: PoolConfig, shape: ModelShape, device: str, comps: dict, tokens: int, sample: int
) -> tuple[str, ...]:
    """The activations with gradient checkpointing as configured and as not, and a sample over
    the micro-batch budget."""
    on = checkpointing_on(pool, device)
    other = pool_activation_bytes(shape, pool, device, tokens, not on)
    notes = [
        f"activations at {tokens} tokens: {gib(comps['activations'])} with checkpointing "
        f"{'on' if on else 'off'}, {gib(other)} with it {'off' if on else 'on'}"
    ]
    if tokens > pool.micro_batch_tokens:
        notes.append(
            f"micro_batch_tokens {pool.micro_batch_tokens} is below the longest sample "
            f"({sample} tokens), which goes alone"
        )
    return tuple(notes)


def _rollout_processes(
    cfg: RunConfig,
    name: str,
    pool: PoolConfig,
    shape: ModelShape,
    device: str,
    memory: int | None,
) -> list[ProcessSizing]:
    """One row per replica (they are alike): on each of its GPUs, its share of the weights and of
    the KV cache of the tasks it collects."""
    agents, sample = len(cfg.agents_of(name)), longest_sample(cfg, name)
    tasks = math.ceil(cfg.run.tasks_per_step / pool.rollout_replicas)
    comps, full, tp = _rollout_gpu_bytes(cfg, pool, shape, device, agents, tasks, sample)
    width, _ = compute_dtype(pool, device)
    host = HOST_BASE_BYTES + shape.params * width + push_bytes(shape, pool, agents=agents)
    if device != "cuda":
        host += sum(comps.values())
    out = []
    for i in range(pool.rollout_replicas):
        plan = _model_process(
            f"rollout-{name}-{i}", "rollout", name, device, tp, comps, memory, host
        )
        if memory is not None and device == "cuda":
            plan = _rollout_kv_fit(plan, cfg, memory, full, tasks, sample, tp)
        out.append(plan)
    return out


def _rollout_gpu_bytes(
    cfg: RunConfig,
    pool: PoolConfig,
    shape: ModelShape,
    device: str,
    agents: int,
    tasks: int,
    sample: int,
) -> tuple[dict[str, int], int, int]:
    """(a replica's components on each of its GPUs, the KV cache of all its sequences at once on
    each, its GPUs)."""
    k = cfg.algorithm.k
    comps = rollout_components(
        shape, pool, agents=agents, k=k, tasks=tasks, sample_tokens=sample, device=device
    )
    full = rollout_full_kv_bytes(shape, pool, k=k, tasks=tasks, sample_tokens=sample, device=device)
    tp = pool.rollout_gpus if device == "cuda" else 1
    if tp > 1:
        # tensor parallel: each GPU holds 1/tp of the weights and of every KV head; the runtime
        # stays whole on each
        comps = {key: v if key == "runtime" else v // tp for key, v in comps.items()}
        full //= tp
    return comps, full, tp


def _rollout_kv_fit(
    plan: ProcessSizing, cfg: RunConfig, memory: int, full: int, tasks: int, sample: int, tp: int
) -> ProcessSizing:
    """The replica with a note on how much of its KV cache fits at once, and the fixes when the
    replica does not fit its GPUs."""
    k, name = cfg.algorithm.k, plan.pool
    room = usable(memory) - plan.gpu_total + plan.gpu["kv_cache"]
    at_once = k * tasks
    if full > room:
        share = max(0, room) * at_once // full
        need = math.ceil(cfg.run.tasks_per_step / max(1, room // (full // tasks)))
        note = (
            f"KV cache for all {at_once} sequences (K {k} x {tasks} tasks x {sample} "
            f"tokens) at once: {gib(full)}; about {share} fit at once and vLLM queues "
            f"the rest (rollout_replicas: {need} would run them all at once)"
        )
    else:
        note = f"KV cache for all {at_once} sequences at once: {gib(full)}"
    plan = replace(plan, notes=(note,))
    if plan.fits is False:
        plan = replace(
            plan,
            fixes=(
                f"shorter samples: max_prompt_tokens + max_tokens of pools.{name}'s agents "
                f"is {sample}",
                f"more GPUs per replica: pools.{name}.rollout_gpus: {tp * 2} (vLLM splits "
                f"the model over them)",
                "a GPU with more memory",
            ),
        )
    return plan


# --- output ---------------------------------------------------------------------------------------


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"

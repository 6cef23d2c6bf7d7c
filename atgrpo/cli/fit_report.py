"""`atgrpo plan`: a run's sizing (atgrpo.cli.sizing) as a table of its processes, what each needs
and whether it fits, and the same check `atgrpo train` makes before it starts anything."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atgrpo.cli.sizing import RunSizing, gib, size_run
from atgrpo.cli.trainer_fit import GPUS_PER_NODE
from atgrpo.config import RunConfig
from atgrpo.config_parse import parse_bytes
from atgrpo.memory import USABLE_FRACTION, GiB, usable

_COLUMNS = (
    ("weights", ("weights", "packed_weights", "adapters")),
    ("casts", ("casts",)),
    ("grads", ("gradients",)),
    ("optim", ("optimizer",)),
    ("fsdp", ("fsdp_units",)),
    ("kl-ref", ("kl_reference",)),
    ("activ", ("activations",)),
    ("logprob", ("logprob",)),
    ("kv", ("kv_cache",)),
    ("runtime", ("runtime",)),
)


def render(plan: RunSizing) -> str:
    """The table `atgrpo plan` prints: GiB per GPU of each process, its host memory, and whether it
    fits."""
    head = ["process", "gpus", *(c for c, _ in _COLUMNS), "total", "of", "fits", "host"]
    rows = [head]
    for p in plan.processes:
        gpu = p.device == "cuda"
        cells = [p.name, str(p.gpus) if p.gpus else "-"]
        for _, keys in _COLUMNS:
            value = sum(p.gpu.get(k, 0) for k in keys) if gpu else 0
            cells.append(f"{value / GiB:.1f}" if value else "-")
        cells += [
            f"{p.gpu_total / GiB:.1f}" if gpu else "-",
            f"{usable(p.gpu_memory) / GiB:.0f}" if gpu and p.gpu_memory else "-",
            {True: "yes", False: "NO", None: "-" if not gpu else "?"}[p.fits],
            f"{p.host / GiB:.1f}",
        ]
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        f"{plan.source}: GiB per GPU ('of': usable, {USABLE_FRACTION:.0%} of each GPU; kv: one "
        f"group's K "
        "sequences); host: GiB of RAM (a cpu process's all)"
    ]
    lines += [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    for p in plan.processes:
        lines += [f"  {p.name}: {n}" for n in p.notes]
    for d in plan.disk:
        lines.append(
            f"  disk, pool {d.pool}: {gib(d.checkpoint)} per checkpoint, {d.checkpoints} in the "
            f"run, at most {d.at_once} at once (run.keep_checkpoints): the trainer's volume needs "
            f"{gib(d.trainer_volume)}; each weight push sends {gib(d.push)} to each of "
            f"{d.replicas} rollout replica(s)"
            + (
                f", which keep {d.pushes_on_disk} on local disk in a swap ({gib(d.replica_disk)})"
                if d.pushes_on_disk
                else ""
            )
        )
    unchecked = [p.name for p in plan.processes if p.device == "cuda" and p.gpu_memory is None]
    if unchecked:
        lines.append(
            f"not checked (no GPU memory stated): {', '.join(unchecked)}. Set "
            f"pools.<name>.gpu_memory "
            "(e.g. 80GiB) or pass --gpu-memory"
        )
    lines += [f"not planned: {m}" for m in plan.unplanned]
    lines += [f"problem: {m}" for m in plan.problems]
    for p in plan.processes:
        if p.fits is False:
            lines.append(
                f"{p.name} does not fit: {gib(p.gpu_total)} needed per GPU, "
                f"{gib(usable(p.gpu_memory or 0))} "
                "usable. Any one of:"
            )
            lines += [f"  - {f}" for f in p.fixes]
    lines.append("fits" if plan.ok else "does not fit")
    return "\n".join(lines)


def train_problem(cfg: RunConfig) -> str | None:
    """What `atgrpo train` checks before it starts anything: the config's GPU pools against the GPU
    memory they state, and in local mode what local mode can start. None when it fits or when
    nothing can be checked: CPU pools (a local CPU run passes without reading a model), GPU pools
    with no memory stated, or whose model config is on the cluster only (they are left out)."""
    if all(p.device == "cpu" for p in cfg.pools.values()):
        return None
    plan = size_run(cfg, source="the config", local=cfg.local_mode)
    if plan.ok:
        return None
    return render(plan) + "\n(see `atgrpo plan CONFIG`; --gpus and --gpu-memory try other GPUs)"


# --- the command ----------------------------------------------------------------------------------


def add_command(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan",
        help="GPU memory, host memory and disk of every process a config starts, "
        "and whether it fits the GPUs it states",
    )
    plan.add_argument("config", type=Path)
    plan.add_argument(
        "--gpus", type=int, help="GPUs of each pool's trainer (overrides pools.<name>.trainer_gpus)"
    )
    plan.add_argument(
        "--gpu-memory",
        help="memory of each GPU, e.g. 80GiB or 141GiB (overrides pools.<name>.gpu_memory)",
    )
    plan.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,  # GPUS_PER_NODE, when the option is left out
        help="GPUs of one node (the chart's gpu.perNode, default 8): a trainer with more spans "
        "nodes, a whole number of them",
    )
    plan.set_defaults(fn=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from atgrpo.cli.preflight import load_run_config

    cfg = load_run_config(args)
    if cfg is None:
        return 2
    memory = None
    if args.gpu_memory is not None:
        memory = parse_bytes(args.gpu_memory)
        if memory is None:
            print(
                f"--gpu-memory {args.gpu_memory!r}: write a size with its unit, e.g. 80GiB or "
                f"141GiB",
                file=sys.stderr,
            )
            return 2
    for flag, value in (("--gpus", args.gpus), ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            print(f"{flag} {value}: give at least 1", file=sys.stderr)
            return 2
    plan = size_run(
        cfg,
        gpus=args.gpus,
        gpu_memory=memory,
        source=str(args.config),
        gpus_per_node=args.gpus_per_node or GPUS_PER_NODE,
    )
    print(render(plan))
    return 0 if plan.ok and not plan.unplanned else 1

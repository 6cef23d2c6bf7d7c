"""The paper's comparisons measured at 135M (issue 56): SmolLM2-135M on reasoning-gym tasks, every
variant of arXiv 2510.11062's tables on the same number of training samples, one table.

    python bench/paper_table.py [--tasks arithmetic,letters] [--variants L0,at-grpo,...]
                                [--steps 24] [--seeds 2] [--out docs/paper_table] [--write-only]

Each cell is bench/real_learning.py's run (its config, the tuned knobs: lr 3e-5, the tool stopped at
its program's fence, K 4, 8 tasks a step, bf16) for --steps steps: every variant collects 64
samples a step (the team's 8 tasks x K 4 x 2 agents, L0's 16 tasks x K 4), so a cell's budget is
samples, and work sharing the machine costs it time, not training (wall minutes are reported
beside). Rows, the paper's:
  single agent, untrained      L0's evaluation at step 0
  single agent + GRPO (L0)     the reasoner alone
  team, untrained              the team's evaluation at step 0 (L1's)
  AT-GRPO, shared model (L1)   at-grpo: tree sampling, groups (task, agent, turn)
  AT-GRPO, LoRA per role (L2)  one base, an adapter per role
  AT-GRPO, model per role (L3) a model per role
  L2 / L3 swapped              the trained per-role policies evaluated in each other's role
  trajectory GRPO              K independent episodes, groups (task, agent)
  grouping by (task), (task, agent), (task, turn): the same tree samples, only the key changed
  turn leave-one-out           (task, agent, turn) groups, each branch's baseline its siblings' mean
A cell's figure is greedy success on the 64 held-out tasks at its last step, with its best beside.
The main tasks' L0 and L1 cells run --seeds seeds, the others one.

Resumable: OUT/paper_table.json keeps every finished cell, and a cell found there is not run
again. OUT gets paper_table.md (the table), paper_table.png (the curves over training samples)
and paper_table.json (every evaluation of every cell). Hours on 2 CPU cores: `make bench` skips
it; its smoke size (ATGRPO_BENCH_SMOKE=1) trains the tiny model one step a cell.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._learning_config import DTYPE, Knobs, run_config  # noqa: E402
from bench._learning_variants import ALL_VARIANTS, TASKS  # noqa: E402
from bench._report import SMOKE, choices, plot_panels  # noqa: E402
from bench._warm_start import warm_model  # noqa: E402
from bench.real_learning import DEFAULT_MODEL, ensure_smollm2, one_run, tiny_model  # noqa: E402

MAIN_TASKS = ("arithmetic", "arithmetic3")  # where the team-vs-L0 cells get every seed
VARIANTS = (
    "L0",
    "at-grpo",
    "L2",
    "L3",
    "trajectory",
    "by-task",
    "by-task-agent",
    "by-task-turn",
    "turn-loo",
)
ROWS = (  # (row, variant, what of its run)
    ("single agent, untrained", "L0", "start"),
    ("single agent + GRPO (L0)", "L0", "end"),
    ("team, untrained", "at-grpo", "start"),
    ("AT-GRPO, shared model (L1)", "at-grpo", "end"),
    ("AT-GRPO, LoRA per role (L2)", "L2", "end"),
    ("AT-GRPO, model per role (L3)", "L3", "end"),
    ("L2, roles swapped", "L2", "swapped"),
    ("L3, roles swapped", "L3", "swapped"),
    ("trajectory GRPO", "trajectory", "end"),
    ("group (task)", "by-task", "end"),
    ("group (task, agent)", "by-task-agent", "end"),
    ("group (task, turn)", "by-task-turn", "end"),
    ("group (task, agent, turn) = L1", "at-grpo", "end"),
    ("turn leave-one-out", "turn-loo", "end"),
)
KNOBS = {"lr": 3e-5, "stop_at_fence": True}  # issue 55's tuned config
# On a task of one turn a turn is the whole episode: grouping by (task, agent) is AT-GRPO's
# (task, agent, turn), and (task, turn) is (task). Those cells are not run there; the table says
# which row they equal.
ONE_TURN_SAME = {"by-task-agent": "at-grpo", "by-task-turn": "by-task"}


def cells(tasks: list[str], variants: list[str], seeds: int) -> list[tuple[str, str, int]]:
    """(task, variant, seed) of the grid: every seed for L0 and L1 on the main tasks; none of a
    grouping that equals another's on a one-turn task (ONE_TURN_SAME)."""
    return [
        (t, v, s)
        for t in tasks
        for v in variants
        if not (TASKS[t].max_turns == 1 and v in ONE_TURN_SAME)
        for s in range(seeds if t in MAIN_TASKS and v in ("L0", "at-grpo") else 1)
    ]


def shown(done: dict[str, dict], tasks: list[str]) -> list[str]:
    """The table's columns: this call's tasks and those of cells kept from earlier calls."""
    return [t for t in TASKS if t in tasks or any(k.startswith(f"{t}/") for k in done)]


def key(task: str, variant: str, seed: int) -> str:
    return f"{task}/{variant}/s{seed}"


def swapped_checkpoint(
    run_dir: Path, variant: str, roles: tuple[str, ...] = ("tool", "reasoner")
) -> Path:
    """A copy of the run's last checkpoint with the two roles' policies exchanged: L3's pools' model
    folders (a pool per agent; each pool folder keeps its own record, atgrpo.json, which names
    the pool), L2's adapter folders (an adapter per agent)."""
    one, two = roles
    from atgrpo.cli.runner import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    out = run_dir / "swapped" / ckpt.name  # step-N: the evaluation takes its step from the name
    shutil.rmtree(out, ignore_errors=True)
    if variant == "L3":
        for pool, other in ((one, two), (two, one)):
            shutil.copytree(ckpt / pool, out / pool, ignore=shutil.ignore_patterns("model"))
            shutil.copytree(ckpt / other / "model", out / pool / "model")
    else:
        shutil.copytree(ckpt / "shared", out / "shared")
        adapters = out / "shared" / "model"
        (adapters / one).rename(adapters / f"was-{one}")
        (adapters / two).rename(adapters / one)
        (adapters / f"was-{one}").rename(adapters / two)
    return out


def one_cell(task: str, variant: str, seed: int, model: str, work: Path, args) -> dict[str, Any]:
    from atgrpo.cli.runner import evaluate
    from atgrpo.config import parse_config

    knobs = Knobs(seed=seed, label=f"s{seed}", **KNOBS)
    start = time.perf_counter()
    # A checkpoint at each evaluation: a cell cut short (the machine went away: a Plan-Path cell
    # takes hours here) resumes from its last one when the grid runs again.
    sizes = (args.steps, args.eval_every, args.eval_tasks)
    run = one_run(task, variant, model, work, *sizes, knobs=knobs, checkpoint_every=args.eval_every)
    if variant in ("L2", "L3"):
        run_dir = Path(run["run_dir"])
        # the swapped evaluation's own run directory: the run's evals/ keeps its own
        data = run_config(
            task, variant, model, run_dir / "swapped", *sizes, dtype=DTYPE, knobs=knobs
        )
        swapped = swapped_checkpoint(run_dir, variant, TASKS[task].team)
        crossed = evaluate(parse_config(data), swapped)
        run["swapped"] = {"step": crossed["step"], "success": crossed["success_rate"]}
    run["cell_wall_s"] = time.perf_counter() - start
    return run


def figure(run: dict | None, what: str) -> str:
    if run is None:
        return "not run"
    if what == "swapped":
        return f"{run['swapped']['success']:.3f}"
    successes = [e["success"] for e in run["evals"]]
    if what == "start":
        return f"{successes[0]:.3f}"
    return f"{successes[-1]:.3f} ({max(successes):.3f})"


def table(done: dict[str, dict], tasks: list[str]) -> str:
    """Tasks across, the paper's rows down; a cell with seeds gives each seed's figure."""
    head = "| method | " + " | ".join(tasks) + " |"
    lines = [head, "|---" * (len(tasks) + 1) + "|", *_rows(done, tasks)]
    note = (
        "Greedy success on the 64 held-out tasks at the last step (the best evaluation in "
        "brackets); seeds separated by /. *not run*: a cell the grid has not reached (machine "
        "time; the README's section says which came first and why); `python bench/paper_table.py` "
        "runs it, keeping every cell here."
    )
    return "\n".join(lines) + "\n\n" + note


def _rows(done: dict[str, dict], tasks: list[str]) -> list[str]:
    out = []
    name: dict[str, str] = {}  # a variant's first row of its trained figure
    for row, variant, what in ROWS:
        if what == "end":
            name.setdefault(variant, row)
    for row, variant, what in ROWS:
        figures = []
        for t in tasks:
            if TASKS[t].max_turns == 1 and variant in ONE_TURN_SAME:
                figures.append(f"= {name[ONE_TURN_SAME[variant]]} (one turn)")
                continue
            runs = [r for k, r in sorted(done.items()) if k.startswith(f"{t}/{variant}/")]
            figures.append(" / ".join(figure(r, what) for r in runs) or "not run")
        out.append(f"| {row} | " + " | ".join(figures) + " |")
    return out


def warm_lines(warm: dict[str, dict]) -> str:
    """What each warm start took, under the table."""
    if not warm:
        return ""
    lines = ["", "", "Warm starts (each task's variants all start from it; bench/_warm_start.py):"]
    for task, w in sorted(warm.items()):
        d, f = w["demos"], w["sft"]
        # the fine-tune keeps each epoch's mean loss: one epoch has one
        loss = (
            f"mean loss {f['loss_first']:.3f}"
            if f["epochs"] == 1
            else f"epoch mean loss {f['loss_first']:.3f} -> {f['loss_last']:.3f}"
        )
        lines.append(
            f"- {task}: {d['demos']} demonstrations from the {d['kept']} of {d['episodes']} "
            f"train episodes its env's solver won; {f['epochs']} epoch(s) of {f['steps']} "
            f"batches at lr {w['lr']:g}, {f['seconds'] / 60:.1f} min, {loss}"
        )
    return "\n".join(lines)


def plot(done: dict[str, dict], path: Path) -> None:
    panels: dict[str, list] = {}
    for k, r in sorted(done.items()):
        samples = r.get("samples_per_step", 64)
        panels.setdefault(f"SmolLM2-135M, {r['task']}", []).append(
            (
                k.split("/", 1)[1],
                [e["step"] * samples for e in r["evals"]],
                [e["success"] for e in r["evals"]],
            )
        )
    plot_panels(panels, path, "training samples", "greedy eval success")


def write(out: Path, done: dict[str, dict], tasks: list[str], warm: dict[str, dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    saved = {"cells": done, "warm_starts": warm}
    (out / "paper_table.json").write_text(json.dumps(saved, indent=1) + "\n")
    (out / "paper_table.md").write_text(table(done, tasks) + warm_lines(warm) + "\n")
    plot(done, out / "paper_table.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="arithmetic" if SMOKE else ",".join(TASKS))
    ap.add_argument("--variants", default="L0,L3" if SMOKE else ",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=1 if SMOKE else 24)
    ap.add_argument("--seeds", type=int, default=1 if SMOKE else 2)
    ap.add_argument("--eval-every", type=int, default=1 if SMOKE else 4)
    ap.add_argument("--eval-tasks", type=int, default=2 if SMOKE else 64)
    ap.add_argument("--model", default="", help="model directory (default: SmolLM2, built)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "paper_table"))
    ap.add_argument(
        "--warm-start",
        choices=("auto", "all", "none"),
        default="auto",
        help="fine-tune the model on each task's env demonstrations before every variant: auto "
        "where the task asks for it (those SmolLM2 starts at 0 on), all, or none",
    )
    ap.add_argument(
        "--warm-episodes",
        type=int,
        default=4 if SMOKE else 200,
        help="train episodes played with the env's solver for a warm start's demonstrations",
    )
    ap.add_argument(
        "--write-only",
        action="store_true",
        help="run nothing: write the table, curves and JSON of the cells kept in OUT, with --tasks "
        "as columns beside theirs",
    )
    args = ap.parse_args()
    tasks = choices(ap, args.tasks, TASKS, "task")
    variants = choices(ap, args.variants, ALL_VARIANTS, "variant")
    out = Path(args.out)
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or (
        "" if args.write_only else tiny_model(work) if SMOKE else ensure_smollm2(DEFAULT_MODEL)
    )
    saved = out / "paper_table.json"
    kept = json.loads(saved.read_text()) if saved.exists() else {}
    done: dict[str, dict] = kept.get("cells", {})
    warm: dict[str, dict] = kept.get("warm_starts", {})
    for task, variant, seed in [] if args.write_only else cells(tasks, variants, args.seeds):
        if key(task, variant, seed) in done:
            print(f"{key(task, variant, seed)}: done before, kept", flush=True)
            continue
        start = model
        if args.warm_start == "all" or (args.warm_start == "auto" and TASKS[task].warm_start):
            if task not in warm:
                config = run_config(task, "at-grpo", model, work / f"warm-{task}" / "run", 1, 1, 1)
                episodes = TASKS[task].warm_episodes or args.warm_episodes
                warm[task] = warm_model(config, model, work / f"warm-{task}", episodes)
                print(f"{task}: warm start, {warm[task]}", flush=True)
            start = warm[task]["model"]
        done[key(task, variant, seed)] = one_cell(task, variant, seed, start, work, args)
        done[key(task, variant, seed)]["warm_start"] = start != model
        print(f"{key(task, variant, seed)}: {figure(done[key(task, variant, seed)], 'end')}")
        write(out, done, shown(done, tasks), warm)  # each finished cell is kept at once
    write(out, done, shown(done, tasks), warm)
    print("\n" + table(done, shown(done, tasks)))


if __name__ == "__main__":
    main()

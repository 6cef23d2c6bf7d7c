"""A real model learning real tasks: SmolLM2-135M-Instruct trained with AT-GRPO on CPU, against
single-agent GRPO (L0) and trajectory-level GRPO on the same budget.

    python bench/real_learning.py [--tasks arithmetic,letters] [--variants at-grpo,L0,trajectory]
                                  [--steps 40] [--eval-every 10] [--eval-tasks 64] [--model DIR]
                                  [--target 0.9 [--hold 2]] [--compare-target 0.7]
                                  [--out docs/real_learning]
                                  [--lr 1e-5] [--k 4] [--tasks-per-step 8] [--seed 0] [--label L]

Tasks (reasoning-gym, through the `reasoning_gym` env: its hardened judges, a tool agent whose
program runs in the sandbox, and a reasoner that answers in <answer></answer>):
  arithmetic  basic_arithmetic, a sum or difference of two one-digit numbers ("Calculate 5 - 9.").
              The untrained model's programs often compute it (`result = 5 - 9`) but print it in
              a sentence ("The answer is -4.") the judge does not read as the number, and its
              reasoner does not always take the tool's result: weak, not hopeless, and what RL
              can close. (With negation, parentheses, * and /, its programs computed nothing
              useful: 0 of 64 right, 1 of 64 solved.)
  letters     letter_counting, 5 to 8 words ("How many times does the letter "e" appear in
              ..."): the tool agent can count exactly with str.count if it learns to, the
              reasoner cannot by itself.
  arithmetic3 basic_arithmetic, two three-digit numbers and + - * ("Calculate 312 * 845."): the
              tool's program computes it, the reasoner alone does not.
Variants, one shared model (full weights), K = 4, 8 tasks a step, temperature 1:
  at-grpo     L1 (tool + reasoner), tree sampling, groups (task, agent, turn), alpha 1
  trajectory  L1, K independent episodes a task, groups (task, agent), each sample gets its
              episode's return (algorithm.grouping: trajectory)
  L0          the reasoner alone (env.turn_order: [reasoner]), 16 tasks a step: as many samples
  trl         L0's run by TRL's GRPOTrainer: its tasks, prompts, judge, optimizer, atgrpo's
              evaluation of its saves (bench/_trl_variant.py; what differs is recorded)
Every variant runs --steps steps; success is greedy (temperature 0) on the first --eval-tasks
entries of the eval split (never trained on), at step 0, every --eval-every steps and at the end.
Time to accuracy (--target T): a run stops --hold evaluations after its greedy success first
reaches T, and reports the training minutes to that evaluation's step (evaluations not counted;
their minutes are reported beside), its steps and samples, and whether success held at or above
T at the --hold evaluations after it. --compare-target T (default --target) adds a table of every
run's training minutes, steps and samples to T, from its evaluations. The knobs a user tunes
(--lr, --k, --tasks-per-step, --seed) go with a --label that keeps such runs apart: their own
directory and table row.
Output in --out: real_learning.md (the table), real_learning.png (the curves) and
real_learning.json (every evaluation, the training seconds, and what the eval samples show: the
share of each agent's answers the judge could not read, and of tool programs that printed the
right answer). Each run's eval samples stay in its run directory (run.save_eval_samples).

Tens of minutes a run on 2 CPU cores: `make bench` skips it; its smoke size (ATGRPO_BENCH_SMOKE=1,
what tests/bench runs) trains the tiny model two steps on the arithmetic task.

A run's config (the knobs, run_config) is bench/_learning_config.py's, the tasks and variants
bench/_learning_variants.py's, the tables and curves bench/_learning_report.py's; this file runs
and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._learning_config import (  # noqa: E402
    DTYPE,
    LR,
    TASKS_PER_STEP,
    K,
    Knobs,
    run_config,
)
from bench._learning_report import (  # noqa: E402
    DTYPE_SUFFIX,
    compare_table,
    eval_samples_show,
    plot,
    reached,
    run_dtype,
    run_record,
    table,
    target_stop,
    target_table,
)
from bench._learning_variants import ALL_VARIANTS, TASKS, VARIANTS  # noqa: E402
from bench._report import SMOKE, choices  # noqa: E402

DEFAULT_MODEL = ROOT / ".atgrpo" / "models" / "smollm2"
BREAKDOWN = (
    "step_seconds",
    "time_prefill_s",
    "time_decode_s",
    "time_env_s",
    "time_wait_s",
    "time_forward_s",
    "time_backward_s",
    "time_optimizer_s",
    "weight_sync_seconds",
    "gen_mfu",
    "update_mfu",
)


def stop_due(took: list[float], budget_s: float) -> bool:
    """Whether to ask the run to stop, given each step's training seconds so far. The router
    finishes the step in flight after a stop (run_until), so the stop is asked when the step
    after that one would end past the budget, as the last three steps' mean foretells: the last
    step trained ends within it. (Asked once the budget was spent, the first real run trained
    62.8 minutes of 60.)"""
    return sum(took) + 2 * statistics.fmean(took[-3:]) > budget_s


def one_run(
    task: str,
    variant: str,
    model: str,
    work: Path,
    steps: int,
    eval_every: int,
    eval_tasks: int,
    minutes: float | None = None,
    dtype: str = DTYPE,
    target: float | None = None,
    hold: int = 2,
    knobs: Knobs = Knobs(),  # noqa: B008 - a frozen dataclass
    checkpoint_every: int = 0,
) -> dict:
    """Train one variant on one task through the five local services; its evaluations and times.
    `minutes`: stop at the last step whose training time (evaluations not counted) stays within
    it, as the recent steps' times foretell, and evaluate that step's checkpoint, if the run has
    not reached `steps` by then. `target`: stop `hold` evaluations after greedy success first
    reaches it (time_to_target). `checkpoint_every` > 0: checkpoints that often, and a run
    directory left with one (a run cut short: the machine went away) is resumed from its last
    checkpoint instead of started over; `wall_s` then counts this part only."""
    from atgrpo.cli.runner import LocalServices, evaluate, run_until
    from atgrpo.config import parse_config
    from atgrpo.rundir import read_metrics

    run_dir = work / (
        f"{task}-{variant}{DTYPE_SUFFIX[dtype]}" + (f"-{knobs.label}" if knobs.label else "")
    )
    if variant == "trl":  # TRL's GRPOTrainer in L0's setting, atgrpo's evaluation
        from bench._trl_variant import trl_run

        args = (steps, eval_every, eval_tasks, minutes, dtype, target, hold, knobs)
        return trl_run(task, model, run_dir, *args)
    resumed = checkpointed_step(run_dir) if checkpoint_every else 0
    if not resumed:  # a rerun starts over, never resumes a run that kept no checkpoint
        shutil.rmtree(run_dir, ignore_errors=True)
    data = run_config(
        task, variant, model, run_dir, steps, eval_every, eval_tasks, dtype, knobs, checkpoint_every
    )
    took: list[float] = []  # each step's training seconds
    successes: list[float] = []  # each evaluation's greedy success
    # An evaluation's seconds: from the event before it (its step's, or the run's start) to its own.
    eval_s, last_event = [0.0], [time.perf_counter()]

    def spent(event: dict) -> bool:
        now, since = time.perf_counter(), last_event[0]
        last_event[0] = now
        if event["kind"] == "eval":
            eval_s[0] += now - since
            successes.append(event["success_rate"])
            return target is not None and target_stop(successes, target, hold)
        if event["kind"] != "step" or minutes is None:
            return False
        took.append(
            event["rollout_seconds"] + event["train_seconds"] + event["weight_sync_seconds"]
        )
        return stop_due(took, minutes * 60)

    start = time.perf_counter()
    with LocalServices(parse_config(data)) as running:
        reason = "the bench's minutes are spent, or its target held"
        final = asyncio.run(run_until(running, spent, reason))
    if final["state"] not in ("finished", "stopped"):
        raise RuntimeError(f"{task}/{variant} ended {final['state']}: {final}")
    events = read_metrics(run_dir / "metrics.jsonl")
    steps_ = [e for e in events if e["kind"] == "step"]
    timed = [  # what time_to_target reads, kept with the run (the minutes-to-T table)
        {
            "step": e["step"],
            "step_seconds": e["step_seconds"],
            "samples": sum(a["samples"] for a in e["agents"].values()),
        }
        for e in steps_
    ]
    evals = [
        (e, run_dir / "eval-samples" / f"step-{e['step']:06d}.jsonl")
        for e in events
        if e["kind"] == "eval"
    ]
    # stopped between evaluations: its last checkpoint
    if evals[-1][0]["step"] != steps_[-1]["step"]:
        result = evaluate(parse_config(data), run_dir)
        (kept,) = (run_dir / "evals").glob("*/eval-samples/*.jsonl")
        evals.append(({**result, "step": steps_[-1]["step"]}, kept))
    eval_s[0] += earlier_eval_seconds([e for e, _ in evals], resumed)
    scored = [
        {
            "step": e["step"],
            "success": e["success_rate"],
            "returns": {a: m["reward_mean"] for a, m in e["agents"].items()},
            **{k: e[k] for k in ("time", "eval_seconds") if k in e},  # the router's evaluations
            **eval_samples_show(kept),
        }
        for e, kept in evals
    ]
    return {
        **run_record(task, variant, dtype, knobs, start, run_dir, timed, scored, eval_s[0]),
        **reached(timed, scored, target, hold),
        **({"resumed_after_step": resumed} if resumed else {}),
        "train_reward": [(e["step"], e["reward_mean"]) for e in steps_],
        "samples_per_step": statistics.fmean(e["samples"] for e in timed),
        "trained_samples_per_step": statistics.fmean(
            sum(p.get("samples", 0.0) for p in e["pools"].values()) for e in steps_
        ),
        "tokens_per_step": statistics.fmean(
            sum(p.get("tokens", 0.0) for p in e["pools"].values()) for e in steps_
        ),
        "time_breakdown_s": {k: statistics.fmean(e.get(k, 0.0) for e in steps_) for k in BREAKDOWN},
    }


def earlier_eval_seconds(evals: list[dict], resumed: int) -> float:
    """The seconds of the evaluations an earlier process ran before this one resumed after step
    `resumed` (0: none): those up to that step, the checkpoint's own included (the router
    evaluates a step before it checkpoints it, and a resume does not evaluate it again)."""
    return sum(e.get("eval_seconds", 0.0) for e in evals if resumed and e["step"] <= resumed)


def checkpointed_step(run_dir: Path) -> int:
    """The step of the last checkpoint `run_dir` holds (0: none, or no run there)."""
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return 0
    checkpoint = state.get("checkpoint") if isinstance(state, dict) else None
    return int(checkpoint["step"]) if checkpoint else 0


def tiny_model(work: Path) -> str:
    from atgrpo.models import build_tiny_model

    return str(build_tiny_model(work / "tiny"))


def ensure_smollm2(path: Path) -> str:
    if not (path / "config.json").exists():
        from atgrpo.models.smollm2 import convert_smollm2

        convert_smollm2(path)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="arithmetic" if SMOKE else ",".join(TASKS))
    ap.add_argument("--variants", default="at-grpo,L0" if SMOKE else ",".join(VARIANTS))
    ap.add_argument(
        "--steps", type=int, default=2 if SMOKE else 200, help="at most this many steps"
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=None if SMOKE else 60.0,
        help="training minutes (evaluations not counted) a run stays within; it is evaluated at "
        "its end",
    )
    ap.add_argument(
        "--target",
        type=float,
        default=None,
        help="time to accuracy: stop a run --hold evaluations after its greedy success first "
        "reaches this, and report the training minutes, steps and samples to it",
    )
    ap.add_argument(
        "--hold",
        type=int,
        default=2,
        help="with --target: the evaluations after the first at the target that must stay at it",
    )
    ap.add_argument(
        "--compare-target",
        type=float,
        default=None,
        help="the minutes-to-T table's T for every run in the table (default: --target)",
    )
    ap.add_argument("--lr", type=float, default=LR, help="the pool's learning rate")
    ap.add_argument("--k", type=int, default=K, help="branches per agent per turn")
    ap.add_argument(
        "--tasks-per-step", type=int, default=TASKS_PER_STEP, help="tasks a step (L0: twice)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="asynchronous AT-GRPO: collect up to this many steps ahead of training (0: in turns)",
    )
    ap.add_argument(
        "--stop-at-fence",
        action="store_true",
        help="end the tool agent's generation at its program's closing fence",
    )
    ap.add_argument(
        "--stop-at-paragraph",
        action="store_true",
        help="end the reasoner's generation at its first blank line (its answer's paragraph)",
    )
    ap.add_argument(
        "--eval-overlap",
        action="store_true",
        help="evaluate beside the next step's collection, not in a pause (run.eval_overlap)",
    )
    ap.add_argument(
        "--min-lr-ratio",
        type=float,
        default=1.0,
        help="cosine decay of the learning rate over --steps to this fraction of it (1: constant)",
    )
    ap.add_argument(
        "--label",
        default="",
        help="names runs made with other knobs (their directory and table row), e.g. lr3e-5",
    )
    ap.add_argument("--eval-every", type=int, default=1 if SMOKE else 10)
    ap.add_argument("--eval-tasks", type=int, default=2 if SMOKE else 64)
    ap.add_argument(
        "--model",
        help=f"a model directory (default: {DEFAULT_MODEL}, built when missing; "
        "the tiny model in smoke mode)",
    )
    ap.add_argument(
        "--dtype",
        choices=list(DTYPE_SUFFIX),
        default=DTYPE,
        help="the pool's dtype: bfloat16 = the update under bf16 autocast over float32 masters and "
        "the rollout in bf16 (this CPU's bf16 matmuls run ~2.5x float32's)",
    )
    ap.add_argument("--out", default=str(ROOT / "runs" / "real_learning"))
    ap.add_argument("--work", help="where the runs' directories go (default: OUT/runs)")
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="drop the runs OUT/real_learning.json holds "
        "(default: keep those of other tasks and variants)",
    )
    args = ap.parse_args()
    tasks = choices(ap, args.tasks, TASKS, "task")
    variants = choices(ap, args.variants, ALL_VARIANTS, "variant")
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or (tiny_model(work) if SMOKE else ensure_smollm2(DEFAULT_MODEL))
    # Runs measured before (another invocation's tasks or variants) stay in the table, unless
    # redone.
    kept = out / "real_learning.json"
    runs = (
        [
            r
            for r in json.loads(kept.read_text())["runs"]
            if (r["task"], r["variant"], run_dtype(r), r.get("label", ""))
            not in {(t, v, args.dtype, args.label) for t in tasks for v in variants}
        ]
        if kept.exists() and not args.fresh
        else []
    )
    start = time.perf_counter()
    for task in tasks:
        for variant in variants:
            run = one_run(
                task,
                variant,
                model,
                work,
                args.steps,
                args.eval_every,
                args.eval_tasks,
                args.minutes,
                args.dtype,
                args.target,
                args.hold,
                Knobs(
                    args.lr,
                    args.k,
                    args.tasks_per_step,
                    args.seed,
                    args.max_staleness,
                    args.stop_at_fence,
                    args.label,
                    args.eval_overlap,
                    args.min_lr_ratio,
                    args.stop_at_paragraph,
                ),
            )
            runs.append(run)
            print(
                f"{task:>10} {variant:>10}: "
                + " ".join(f"{e['step']}:{e['success']:.3f}" for e in run["evals"])
                + (
                    f"  (training {run['train_s'] / 60:.1f} min,"
                    f" {run['wall_s'] / 60:.1f} min in all)"
                ),
                flush=True,
            )
            write(out, args, runs, time.perf_counter() - start)  # each finished run is kept at once
    print("\n" + report(args, runs))


def report(args: argparse.Namespace, runs: list[dict]) -> str:
    """The table, then the time-to-accuracy and the minutes-to-T tables when there are any."""
    compare = args.compare_target if args.compare_target is not None else args.target
    tables = (table(runs), target_table(runs), compare_table(runs, compare, args.hold))
    return "\n\n".join(t for t in tables if t)


def write(out: Path, args: argparse.Namespace, runs: list[dict], took: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "real_learning.md").write_text(report(args, runs) + "\n")
    (out / "real_learning.json").write_text(
        json.dumps(
            {
                "args": vars(args),
                "model": args.model or str(DEFAULT_MODEL),
                "minutes_this_call": took / 60,
                "defaults": {"k": K, "tasks_per_step": TASKS_PER_STEP, "lr": LR},
                "max_tokens": {t: TASKS[t].max_tokens for t in {r["task"] for r in runs}},
                "runs": runs,
            },
            indent=1,
        )
    )
    plot(runs, out / "real_learning.png")


if __name__ == "__main__":
    main()

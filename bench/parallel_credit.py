"""Fair credit in parallel turns, measured: `algorithm.parallel_credit: paired` against `all_pairs`
on the parallel toy (bench/_twin_env.py: both roles must name the secret digit at once).

The start is the tiny model taught (atgrpo.models.taught.teach) to answer a role told secret s
with s or its pair (1-2, 3-4) at random: each role is right half the time, the team a quarter.
Paired credit scores branch k of both roles together, so a right answer earns 1 only when its
same-index partner is right too, and half the right answers are scored as failures; all_pairs
scores every answer against all K partner answers (K x K joint actions), so every right answer
earns the fraction of partner answers that are right. Same runs otherwise: L1 shared model, K = 8,
8 tasks a step, temperature 1, at most 4 new tokens, lr 5e-4, one optimizer step a step.
Success is evaluated every --eval-every steps on 64 eval tasks, sampled at temperature 1.
Output: a table (stdout and OUT/parallel_credit.md), curves (OUT/parallel_credit.png) and every
figure (OUT/parallel_credit.json).

    python bench/parallel_credit.py [--seeds 0,1] [--steps 40] [--eval-every 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import SMOKE, plot_panels  # noqa: E402

K, TASKS_PER_STEP, EVAL_TASKS = 8, 8, 64
SAMPLING = {"temperature": 1.0, "max_tokens": 4}
VARIANTS = ("paired", "all_pairs")
ENV_PATH = "bench._twin_env:TwinEnv"


def run_config(variant: str, seed: int, model: str, run_dir: Path, steps: int, every: int) -> dict:
    return {
        "run": {
            "name": f"credit-{variant.replace('_', '-')}-{seed}",
            "seed": seed,
            "steps": steps,
            "tasks_per_step": TASKS_PER_STEP,
            "eval_every_steps": every,
            "eval_tasks": EVAL_TASKS,
            "checkpoint_every_steps": steps,
            "keep_checkpoints": 1,
            "run_dir": str(run_dir),
        },
        "env": {
            "name": "twin",
            "path": ENV_PATH,
            "turn_order": ["left", "right"],
            "max_turns": 1,
            "parallel": True,
        },
        "pools": {
            "shared": {
                "model_path": model,
                "device": "cpu",
                "dtype": "float32",
                "optim": {"lr": 5e-4, "warmup_steps": 0, "min_lr_ratio": 1.0},
            }
        },
        "agents": {
            a: {"pool": "shared", "train_sampling": SAMPLING, "eval_sampling": SAMPLING}
            for a in ("left", "right")
        },
        "algorithm": {"k": K, "mini_batch_size": 1024, "parallel_credit": variant},
    }


def one_run(variant: str, seed: int, model: str, work: Path, steps: int, every: int) -> dict:
    from atgrpo.cli.runner import LocalServices, run_until
    from atgrpo.config import parse_config
    from atgrpo.rundir import read_metrics

    run_dir = work / f"{variant}-{seed}"
    start = time.perf_counter()
    with LocalServices(parse_config(run_config(variant, seed, model, run_dir, steps, every))) as s:
        final = asyncio.run(run_until(s, lambda _event: False))
    if final["state"] != "finished":
        raise RuntimeError(f"{variant}/seed {seed} ended {final['state']}: {final}")
    events = read_metrics(run_dir / "metrics.jsonl")
    steps_ = [e for e in events if e["kind"] == "step"]
    return {
        "variant": variant,
        "seed": seed,
        "wall_s": time.perf_counter() - start,
        "evals": [(e["step"], e["success_rate"]) for e in events if e["kind"] == "eval"],
        "step_s": statistics.fmean(e["step_seconds"] for e in steps_) if steps_ else 0.0,
    }


PAIRS = {"1": "2", "2": "1", "3": "4", "4": "3"}


def taught(work: Path) -> str:
    """The tiny model, taught to answer either role told secret s with s or its pair (1-2, 3-4)
    at random: each role is right half the time, the team a quarter."""
    from atgrpo.models import build_tiny_model
    from atgrpo.models.taught import teach

    base = build_tiny_model(work / "tiny")
    shown = [
        (f"{role}-{s}", f"{role}: the secret is {s}", s)
        for role in ("left", "right")
        for s in PAIRS
    ]
    prompts = [(key, [{"role": "user", "content": text}]) for key, text, _ in shown]
    answers = {key: [s, PAIRS[s]] for key, _, s in shown}
    return teach(base, work / "taught", prompts, answers, steps=600, lr=1e-3)


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        steps = [s for s, _ in mine[0]["evals"]]
        curve = [statistics.fmean(r["evals"][i][1] for r in mine) for i in range(len(steps))]
        rows.append(
            {
                "variant": variant,
                "seeds": [r["seed"] for r in mine],
                "steps": steps,
                "success": curve,
                "step_s": statistics.fmean(r["step_s"] for r in mine),
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    steps = rows[0]["steps"]
    head = "| credit | " + " | ".join(f"step {s}" for s in steps) + " | s/step |"
    lines = [head, "|" + "---|" * (len(steps) + 2)]
    for r in rows:
        cells = " | ".join(f"{v:.2f}" for v in r["success"])
        lines.append(f"| {r['variant']} | {cells} | {r['step_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0" if SMOKE else "0,1")
    ap.add_argument("--steps", type=int, default=2 if SMOKE else 40)
    ap.add_argument("--eval-every", type=int, default=1 if SMOKE else 5)
    ap.add_argument("--model", help="a model taught the format already (default: taught here)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "parallel_credit"))
    args = ap.parse_args()
    os.chdir(ROOT)  # the env service imports bench._twin_env from the folder it starts in
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="parallel-credit-") as tmp:
        work = Path(tmp)
        model = args.model or taught(work)
        for seed in (int(s) for s in args.seeds.split(",")):
            for variant in VARIANTS:
                run = one_run(variant, seed, model, work, args.steps, args.eval_every)
                print(
                    f"{variant:>9} seed {seed}: "
                    + " ".join(f"{s}:{v:.2f}" for s, v in run["evals"])
                    + f"  ({run['wall_s']:.0f} s)",
                    flush=True,
                )
                runs.append(run)
    rows = summarise(runs)
    text = table(rows)
    took = time.perf_counter() - start
    print(f"\n{text}\n\n{len(runs)} runs in {took / 60:.1f} min")
    (out / "parallel_credit.md").write_text(text + "\n")
    (out / "parallel_credit.json").write_text(
        json.dumps({"args": vars(args), "minutes": took / 60, "rows": rows, "runs": runs}, indent=1)
    )
    seeds = len(rows[0]["seeds"])
    plot_panels(
        {f"twin (mean of {seeds} seeds)": [(r["variant"], r["steps"], r["success"]) for r in rows]},
        out / "parallel_credit.png",
        "step",
        "eval success (sampled, T=1)",
    )


if __name__ == "__main__":
    main()

"""bench/real_learning.py's report: the table of its runs, the time-to-accuracy table of those
made with --target, the minutes-to-T table of every run (--compare-target), and the curves over
training minutes."""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench._report import plot_panels

FAILURE = -1.0  # the env's failure_reward: the judge could not read the answer

# A run's directory and curve name carry its dtype but for float32's (the first runs').
DTYPE_SUFFIX = {"float32": "", "bfloat16": "-bf16"}


def run_name(run: dict) -> str:
    """The variant, with the label of a run made with other knobs."""
    return run["variant"] + (f" ({run['label']})" if run.get("label") else "")


def run_dtype(run: dict) -> str:
    return run.get("dtype", "float32")  # runs recorded before the dtype was were float32


def target_stop(successes: list[float], target: float, hold: int) -> bool:
    """Whether a run whose evaluations so far scored `successes` (greedy success, step 0 first)
    has what --target asks: the first evaluation at or above `target`, and `hold` after it."""
    first = next((i for i, x in enumerate(successes) if x >= target), None)
    return first is not None and len(successes) - 1 - first >= hold


def time_to_target(
    steps: list[dict], evals: list[dict], target: float, hold: int
) -> dict[str, Any] | None:
    """The training it took to reach `target` (None when no evaluation did): the first evaluation
    at or above it, the steps, samples and training minutes (each step's step_seconds, which
    leave evaluations out but for what an overlapped one (run.eval_overlap) cost its next step;
    `steps`: a run's "steps", each with its step_seconds and samples) up
    to its step, whether the `hold` evaluations after it stayed at or above the target (None
    when the run ended before them), and the wall minutes to it, evaluations included."""
    first = next((i for i, e in enumerate(evals) if e["success"] >= target), None)
    if first is None:
        return None
    step = evals[first]["step"]
    upto = [e for e in steps if e["step"] <= step]
    after = evals[first + 1 : first + 1 + hold]
    clock = [e.get("time") for e in (evals[0], evals[first])]
    return {
        "step": step,
        "minutes": sum(e["step_seconds"] for e in upto) / 60,
        "samples": int(sum(e["samples"] for e in upto)),
        "held": all(e["success"] >= target for e in after) if len(after) == hold else None,
        # from the end of the evaluation before training to the end of this one: the training
        # and every evaluation between, overlapped or not (runs recorded before evaluations had
        # a time: None)
        **({"wall_minutes": (clock[1] - clock[0]) / 60} if None not in clock else {}),
    }


def table(runs: list[dict]) -> str:
    head = (
        "| task | variant | dtype | greedy success: start | best | end | gain (end - start) "
        "| training min | s / step | samples / step | reasoner unreadable: start -> end "
        "| tool right: start -> end |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in runs:
        first, last = r["evals"][0], r["evals"][-1]
        best = max(e["success"] for e in r["evals"])
        tool = (
            f"{first['tool_right']:.2f} -> {last['tool_right']:.2f}"
            if "tool_right" in first
            else "-"
        )
        lines.append(
            f"| {r['task']} | {run_name(r)} | {run_dtype(r)} | {first['success']:.3f} | "
            f"{best:.3f} | "
            f"{last['success']:.3f} | {last['success'] - first['success']:+.3f} | "
            f"{r['train_s'] / 60:.1f} | {r['step_s']:.0f} | {r['samples_per_step']:.0f} | "
            f"{first['reasoner_unreadable']:.2f} -> {last['reasoner_unreadable']:.2f} | {tool} |"
        )
    return "\n".join(lines)


def target_table(runs: list[dict]) -> str:
    """Time to accuracy of the runs made with --target ("" when none was)."""
    timed = [r for r in runs if "to_target" in r]
    if not timed:
        return ""
    head = (
        "| task | variant | dtype | target | reached at step | training min to it | samples to it "
        "| wall min to it (evaluations in) | evaluation min (whole run) | held after |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in timed:
        t = r["to_target"]
        wall = f"{t['wall_minutes']:.1f}" if t and "wall_minutes" in t else "-"
        reached = (
            f"{t['step']} | {t['minutes']:.1f} | {t['samples']} | {wall} | "
            f"{r['eval_s'] / 60:.1f} | "
            + {True: "yes", False: "no", None: "not measured"}[t["held"]]
            if t
            else f"not reached | - | - | - | {r['eval_s'] / 60:.1f} | -"
        )
        lines.append(
            f"| {r['task']} | {run_name(r)} | {run_dtype(r)} | {r['target']} | {reached} |"
        )
    return "\n".join(lines)


def compare_table(runs: list[dict], target: float | None, hold: int) -> str:
    """Minutes to `target` of every run, side by side (TRL's L0, atgrpo's L0, the team), from
    each run's own evaluations and steps ("" without a target; a run recorded before runs kept
    their steps has no figures)."""
    if target is None:
        return ""
    head = (
        f"| task | variant | dtype | minutes to {target} (training) | steps to it | samples to it "
        f"| held {hold} evaluations after | best success |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in runs:
        t = time_to_target(r["steps"], r["evals"], target, hold) if "steps" in r else None
        best = max(e["success"] for e in r["evals"])
        figures = (
            f"{t['minutes']:.1f} | {t['step']} | {t['samples']} | "
            + {True: "yes", False: "no", None: "not measured"}[t["held"]]
            if t
            else ("not reached | - | - | -" if "steps" in r else "not recorded | - | - | -")
        )
        lines.append(f"| {r['task']} | {run_name(r)} | {run_dtype(r)} | {figures} | {best:.3f} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    def curve(r: dict) -> tuple[str, list[float], list[float]]:
        # x: minutes of training (evaluations excluded), so the variants share a time axis.
        per_step = r["train_s"] / 60 / max(r["evals"][-1]["step"], 1)
        return (
            run_name(r) + DTYPE_SUFFIX[run_dtype(r)],
            [e["step"] * per_step for e in r["evals"]],
            [e["success"] for e in r["evals"]],
        )

    panels = {
        f"SmolLM2-135M, {task}": [curve(r) for r in runs if r["task"] == task]
        for task in dict.fromkeys(r["task"] for r in runs)
    }
    plot_panels(panels, path, "training minutes (2 CPU cores)", "greedy eval success")


def eval_samples_show(path: Path) -> dict[str, float]:
    """What an evaluation's samples (run.save_eval_samples' file) show: per agent, the share of
    answers the judge could not read (format failures), of right ones (local reward 1) and the
    mean response length."""
    rows = [json.loads(line) for line in path.open()]
    out: dict[str, float] = {}
    for agent in dict.fromkeys(r["agent"] for r in rows):
        mine = [r for r in rows if r["agent"] == agent]
        out[f"{agent}_unreadable"] = sum(r["local_reward"] == FAILURE for r in mine) / len(mine)
        out[f"{agent}_right"] = sum(r["local_reward"] >= 1.0 for r in mine) / len(mine)
        out[f"{agent}_tokens"] = statistics.fmean(len(r["response_ids"]) for r in mine)
    return out


def run_record(
    task: str,
    variant: str,
    dtype: str,
    knobs: Any,  # _learning_config.Knobs, a dataclass
    start: float,
    run_dir: Path,
    steps: list[dict],
    evals: list[dict],
    eval_s: float,
) -> dict[str, Any]:
    """What every variant's result holds (the TRL one too): what ran, with which knobs, its
    evaluations, each step's record and its training seconds (evaluations left out)."""
    return {
        "task": task,
        "variant": variant,
        "dtype": dtype,
        **({"label": knobs.label} if knobs.label else {}),
        "knobs": {k: v for k, v in dataclasses.asdict(knobs).items() if k != "label"},
        "wall_s": time.perf_counter() - start,
        "run_dir": str(run_dir),
        "train_s": sum(e["step_seconds"] for e in steps),
        "eval_s": eval_s,
        "step_s": statistics.fmean(e["step_seconds"] for e in steps),
        "evals": evals,
        "steps": steps,
    }


def reached(steps: list[dict], evals: list[dict], target: float | None, hold: int) -> dict:
    """With --target: the target and what it took to reach it (time_to_target)."""
    if target is None:
        return {}
    return {"target": target, "to_target": time_to_target(steps, evals, target, hold)}

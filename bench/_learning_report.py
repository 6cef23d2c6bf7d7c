"""bench/real_learning.py's report: the table of its runs, the time-to-accuracy table of those
made with --target, and the curves over training minutes."""

from __future__ import annotations

from pathlib import Path

from bench._report import plot_panels

# A run's directory and curve name carry its dtype but for float32's (the first runs').
DTYPE_SUFFIX = {"float32": "", "bfloat16": "-bf16"}


def run_name(run: dict) -> str:
    """The variant, with the label of a run made with other knobs."""
    return run["variant"] + (f" ({run['label']})" if run.get("label") else "")


def run_dtype(run: dict) -> str:
    return run.get("dtype", "float32")  # runs recorded before the dtype was were float32


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
        "| evaluation min (whole run) | held after |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in timed:
        t = r["to_target"]
        reached = (
            f"{t['step']} | {t['minutes']:.1f} | {t['samples']} | {r['eval_s'] / 60:.1f} | "
            + {True: "yes", False: "no", None: "not measured"}[t["held"]]
            if t
            else f"not reached | - | - | {r['eval_s'] / 60:.1f} | -"
        )
        lines.append(
            f"| {r['task']} | {run_name(r)} | {run_dtype(r)} | {r['target']} | {reached} |"
        )
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

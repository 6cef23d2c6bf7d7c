"""Does asynchronous AT-GRPO learn as the synchronous loop does? The demo's config
(examples/toy_L1_tiny.yaml) at max_staleness 0 and 1, for several seeds: the first step whose
greedy evaluation reaches --target, and the async/sync ratio of those steps (the bar: <= 1.25x).
A run stops at that evaluation.

Each run is a full `atgrpo train` (local services, tiny model on CPU): minutes each, so `make
bench` skips this script (bench/all.py SKIP); run it alone.

    python bench/async_learning.py [--seeds 0,1,2] [--steps 400] [--eval-every 25] [--target 0.75]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atgrpo.models import build_tiny_model  # noqa: E402


def first_reaching(metrics: Path, target: float) -> tuple[int | None, list[tuple[int, float]]]:
    evals = [
        (e["step"], e["success_rate"])
        for e in map(json.loads, metrics.read_text().splitlines())
        if e["kind"] == "eval"
    ]
    return next((s for s, r in evals if r >= target), None), evals


def train(
    model: Path, run_dir: Path, seed: int, staleness: int, args
) -> tuple[int | None, list, float]:
    from atgrpo.cli.runner import LocalServices, run_until
    from atgrpo.config import parse_config

    data = yaml.safe_load((ROOT / "examples" / "toy_L1_tiny.yaml").read_text())
    data["run"].update(
        seed=seed,
        steps=args.steps,
        eval_every_steps=args.eval_every,
        checkpoint_every_steps=0,
        run_dir=str(run_dir),
        name=f"async-learning-{seed}-{staleness}",
    )
    data["pools"]["shared"]["model_path"] = str(model)
    data["algorithm"]["max_staleness"] = staleness
    start = time.perf_counter()
    # A run stops at the evaluation that reaches the target: what follows it is not measured.
    with LocalServices(parse_config(data)) as running:
        final = asyncio.run(
            run_until(
                running,
                lambda e: e["kind"] == "eval" and e["success_rate"] >= args.target,
                f"reached {args.target}",
            )
        )
    if final["state"] not in ("finished", "stopped"):
        raise RuntimeError(f"seed {seed}, max_staleness {staleness}: {final}")
    return (*first_reaching(run_dir / "metrics.jsonl", args.target), time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--target", type=float, default=0.75)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="async-learning-") as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        print(
            f"{'seed':>4} {'max_staleness':>13} {'first step >= ' + str(args.target):>20} "
            f"{'seconds':>8}  evals"
        )
        reached: dict[int, dict[int, int | None]] = {}
        for seed in map(int, args.seeds.split(",")):
            for staleness in (0, 1):
                step, evals, seconds = train(
                    model, Path(tmp) / f"{seed}-{staleness}", seed, staleness, args
                )
                reached.setdefault(seed, {})[staleness] = step
                print(
                    f"{seed:>4} {staleness:>13} {str(step):>20} {seconds:>8.0f}  "
                    + " ".join(f"{s}:{r:.2f}" for s, r in evals),
                    flush=True,
                )
        for seed, r in reached.items():
            if r[0] is None or r[1] is None:
                ratio = "n/a (one did not reach the target)"
            elif r[0] == 0:
                ratio = "n/a (the synchronous run started at the target)"
            else:
                ratio = f"{r[1] / r[0]:.2f}x"
            print(f"seed {seed}: async / sync steps to {args.target}: {ratio} (bar <= 1.25x)")


if __name__ == "__main__":
    main()

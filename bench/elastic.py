"""A rollout replica that joins a running run, and one that leaves (issue 39, item 5).

Two cores stand in for two GPUs: every service runs one torch thread, the run's first rollout
replica is pinned to one core and the replica added mid-run to the other (the trainer and the CPU
services unpinned), so a second replica adds what a second GPU would. The model is the "small" test
model (atgrpo.models.tiny, 256 wide, 4 layers): on the tiny one a collection is all per-token
overhead, which a second replica does not share. One local run (bench/e2e.py's L0 workload,
synchronous):

    warm-up, then --steps steps on one replica          samples/s before
    `atgrpo scale a 2` (atgrpo.cli.scale)               its start, its listing, its first samples
    --steps steps on two replicas (the first skipped)   samples/s after
    `atgrpo scale a 1`, one more step, stop

and checks what the run must keep through it: every step recorded exactly once, every sample
drawn from the weights its step trained from (staleness 0). The ratio is samples/s after the
addition over before, in the same run: the collection's (samples over the seconds spent collecting,
what the fleet changes) and the whole step's (the update, on one thread, does not get faster).

    python bench/elastic.py [--size small] [--tasks 16] [--k 8] [--max-tokens 32] [--steps 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import parse_args, record  # noqa: E402
from e2e import atgrpo_config  # noqa: E402

from atgrpo.models import build_tiny_model  # noqa: E402
from atgrpo.rundir import read_metrics  # noqa: E402


def pin(pid: int, core: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def steps_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [e for e in read_metrics(path) if e["kind"] == "step"] if path.exists() else []


def wait_until(ready, give_up: threading.Event, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if give_up.is_set() or time.monotonic() > deadline:
            raise TimeoutError("the run ended before the bench's next change")
        time.sleep(0.05)


def conductor(run_dir: Path, args, cores: list[int], times: dict, give_up: threading.Event):
    """Scale up after the warm-up and the steps before, down after the steps after; `times`
    gets when each change happened and, last, `done_at` (the run stops after the next step)."""
    from atgrpo.cli import launcher
    from atgrpo.cli.scale import scale

    state_dir = run_dir / "services"
    wait_until(lambda: len(steps_of(run_dir)) >= args.warmup + args.steps, give_up)
    times["start"] = time.time()
    scale(run_dir, "a", 2)
    times["listed"] = time.time()
    added = next(s for s in launcher.read_state(state_dir) if s.name == "rollout-a-1")
    pin(added.pid, cores[1])
    wait_until(
        lambda: sum(e["replicas"]["a"] == 2 for e in steps_of(run_dir)) > args.steps, give_up
    )
    scale(run_dir, "a", 1)
    times["done_at"] = len(steps_of(run_dir))


def elastic_run(model: str, root: Path, args) -> tuple[list[dict], dict]:
    from atgrpo.cli import launcher
    from atgrpo.cli.runner import LocalServices, run_until
    from atgrpo.config import parse_config

    data = atgrpo_config(model, root / "run", args)
    data["run"].update(name="bench-elastic", steps=10_000)  # stopped by the conductor
    cfg = parse_config(data)
    run_dir = Path(cfg.run.run_dir)
    cores = sorted(os.sched_getaffinity(0))[:2] * 2
    times: dict = {}
    give_up = threading.Event()
    os.environ["OMP_NUM_THREADS"] = "1"  # the services' torch threads (they inherit it)
    try:
        services = LocalServices(cfg)
        with services as running:
            first = next(
                s for s in launcher.read_state(services.state_dir) if s.name == "rollout-a-0"
            )
            pin(first.pid, cores[0])
            thread = threading.Thread(target=conductor, args=(run_dir, args, cores, times, give_up))
            thread.start()
            try:
                final = asyncio.run(
                    run_until(running, lambda e: e.get("step", 0) > times.get("done_at", 1 << 30))
                )
            finally:
                give_up.set()
                thread.join()
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
    if final["state"] != "stopped" or "done_at" not in times:
        raise RuntimeError(f"the run did not go through the changes: {final}, {times}")
    # A rollback redoes steps on whatever fleet there is then: the rates would mix the phases.
    rollbacks = [e for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "rollback"]
    if rollbacks:
        log = (run_dir / "services" / "logs" / "router.log").read_text().splitlines()
        warned = "\n".join(line for line in log if " WARNING " in line)
        raise RuntimeError(
            f"the run rolled back through the changes ({[e['reason'] for e in rollbacks]}); "
            f"the router's warnings:\n{warned[-4000:]}"
        )
    return steps_of(run_dir), times


def rate(steps: list[dict], seconds: str = "step_seconds") -> float:
    samples = sum(a["samples"] for e in steps for a in e["agents"].values())
    return samples / sum(e[seconds] for e in steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", help="atgrpo.models.tiny's model size")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-5)
    args = parse_args(
        ap, {"size": "tiny", "tasks": 4, "k": 4, "max_tokens": 4, "steps": 2, "warmup": 1}
    )
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
        model = build_tiny_model(Path(tmp) / args.size, args.size)
        steps, times = elastic_run(str(model), Path(tmp), args)
    report(steps, times, args)


def report(steps: list[dict], times: dict, args) -> None:
    numbers = [e["step"] for e in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise RuntimeError(f"steps recorded {numbers}: not each once")
    stale = max(e["pools"]["a"].get("staleness_max", 0) for e in steps)
    if stale:
        raise RuntimeError(f"a synchronous run trained samples {stale} versions behind")
    before = steps[args.warmup : args.warmup + args.steps]
    two = [e for e in steps if e["replicas"]["a"] == 2]
    # the first ran while the joiner was synced beside it; those after the window may have run
    # while the second replica was being removed
    after = two[1 : 1 + args.steps]
    joined = two[0]
    # the end of its collection: the step's event comes after its update and push
    first_samples = joined["time"] - joined["train_seconds"] - joined["weight_sync_seconds"]
    collect = rate(after, "rollout_seconds") / rate(before, "rollout_seconds")
    step = rate(after) / rate(before)
    print(
        f"elastic rollout, L0 toy, {args.tasks} tasks x K={args.k}, <= {args.max_tokens} tokens, "
        f"{args.size} model, CPU float32, one thread per service, each replica on its own core"
    )
    print(f"{'phase':<34} {'steps':>5} {'collected/s':>11} {'step samples/s':>14}")
    for name, part in (("one replica", before), ("two replicas (one joined mid-run)", after)):
        print(
            f"{name:<34} {len(part):>5} {rate(part, 'rollout_seconds'):>11.1f} {rate(part):>14.1f}"
        )
    joiner = (
        f"started -> healthy and listed {times['listed'] - times['start']:.1f} s, -> first "
        f"samples collected {first_samples - times['start']:.1f} s (step {joined['step']})"
    )
    print(
        f"after / before: collection {collect:.2f}x, whole step {step:.2f}x; the joiner: "
        f"{joiner}; scaled back to 1 after step {times['done_at']}; {len(steps)} steps each "
        f"recorded once, staleness 0; tasks collected again after a replica left: "
        f"{sum(e['requeued_tasks'] for e in steps)}"
    )
    record(
        "elastic",
        "collection samples/s after a 2nd rollout replica joined mid-run vs before",
        collect,
        f"whole step {step:.2f}x; joiner {joiner}",
    )


if __name__ == "__main__":
    main()

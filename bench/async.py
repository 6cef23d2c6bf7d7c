"""Asynchronous AT-GRPO (algorithm.max_staleness) against the synchronous loop and TRL, in one run.

Two cores stand in for two GPUs: every service runs one torch thread, the trainers are pinned to
core 0 and the rollout replicas to core 1, so rollout and training can only overlap as they would
on separate devices. The CPU services (router, env, sandbox) are not pinned: on a cluster they run
on CPUs of their own, not on a GPU's, and here they take whichever of the same two cores is free
(TRL gets both cores too). Pinned with the rollout instead, they took 0.34 of its core (env 0.20,
router 0.14, in a 250-step profile), and async / TRL read 1.30x instead of 1.59x.

1. L0 toy (bench/e2e.py's workload: one agent, tasks x K samples, one optimizer step per step):
   samples/s at max_staleness 1 against max_staleness 0 (target >= 1.6x), and against TRL's
   GRPOTrainer in this process with the same two cores (two torch threads; target >= 1.5x).
   The busy fraction of each side is its own seconds (generation in the replica, the update and
   push in the trainer) over the timed window.
2. L3 toy relay, one model per role, the listener's model about 4x the speaker's: sync against
   async, each pool's updates per second and busy fraction. In the synchronous loop the small
   pool waits for the large pool's update before anything is collected again; here the small pool
   trains as soon as its samples are in.

    python bench/async.py [--tasks 8] [--k 8] [--max-tokens 16] [--steps 16] [--warmup 2]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import SMOKE, parse_args, record  # noqa: E402
from e2e import atgrpo_config, trl_side  # noqa: E402

from atgrpo.models import build_tiny_model  # noqa: E402

TRAINER_CORE, ROLLOUT_CORE = 0, 1


def pin(state_dir: Path) -> None:
    """Every thread of the trainers onto the first core, of the rollout replicas onto the second
    (threads made later inherit it); the CPU services stay unpinned (the module docstring)."""
    from atgrpo.cli import launcher

    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        return  # one core: nothing to separate
    trainer, rollout = sorted(cores)[:2]
    for svc in launcher.read_state(state_dir):
        if svc.kind not in ("trainer", "rollout"):
            continue  # a CPU service: on a cluster it has CPUs of its own
        core = trainer if svc.kind == "trainer" else rollout
        for tid in os.listdir(f"/proc/{svc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), {core})
            except (ProcessLookupError, PermissionError):
                pass  # a thread that ended meanwhile


class _Sink:
    def start(self, status):
        pass

    def on_event(self, event):
        pass


def timed_run(data: dict, warmup: int) -> dict:
    """Run `data` with pinned single-thread services; the figures of the steps after `warmup`."""
    from atgrpo.cli.runner import LocalServices, drive
    from atgrpo.config import parse_config
    from atgrpo.rundir import read_metrics

    cfg = parse_config(data)
    os.environ["OMP_NUM_THREADS"] = "1"  # the services' torch threads (they inherit it)
    try:
        services = LocalServices(cfg)
        with services as running:
            pin(services.state_dir)
            final = asyncio.run(drive(running, _Sink()))
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
    if final["state"] != "finished":
        raise RuntimeError(f"the atgrpo run did not finish: {final}")
    steps = [
        e for e in read_metrics(Path(cfg.run.run_dir) / "metrics.jsonl") if e["kind"] == "step"
    ]
    timed = steps[warmup:]
    seconds = timed[-1]["time"] - steps[warmup - 1]["time"]
    pools = {
        p: {
            "updates": sum(1 for e in timed if p in e["pools"]),
            "busy": sum(
                e["pools"][p]["train_seconds"] + e["pools"][p]["push_seconds"]
                for e in timed
                if p in e["pools"]
            )
            / seconds,
        }
        for p in cfg.pools
    }
    return {
        "seconds": seconds,
        "samples": sum(a["samples"] for e in timed for a in e["agents"].values()),
        "rollout_busy": sum(e["rollout_seconds"] for e in timed) / seconds,
        "pools": pools,
        "staleness_max": max(m.get("staleness_max", 0) for e in timed for m in e["pools"].values()),
    }


def both(run, *given) -> tuple[dict, dict]:
    """`run(*given, staleness)` at max_staleness 0 and 1. At smoke size both at once, a process
    each: there the figures only show that each side runs, and one run's waits (start-up, RPCs)
    overlap the other's work (the smoke bench 62 s -> 50 s on two busy cores)."""
    if not SMOKE:
        return run(*given, 0), run(*given, 1)
    with ProcessPoolExecutor(2) as pool:
        sync, asyn = (pool.submit(run, *given, n) for n in (0, 1))
        return sync.result(), asyn.result()


def l0(model: str, root: Path, args, staleness: int) -> dict:
    data = atgrpo_config(model, root / f"l0-{staleness}" / "run", args)
    data["algorithm"]["max_staleness"] = staleness
    return timed_run(data, args.warmup)


def larger_model(tiny: Path, out: Path) -> Path:
    """The tiny model at twice the width and twice the depth (about 4x the parameters), same
    tokenizer."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = AutoConfig.from_pretrained(tiny).to_dict()
    for derived in ("layer_types", "head_dim"):  # worked out again from the new sizes
        d.pop(derived, None)
    d.update({k: 2 * d[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers")})
    cfg = AutoConfig.for_model(**d)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation")) or f.suffix in (
            ".jinja",
        ):
            shutil.copy(f, out / f.name)
    return out


def params(model: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def l3(small: str, large: str, root: Path, args, staleness: int) -> dict:
    data = atgrpo_config(small, root / f"l3-{staleness}" / "run", args)
    data["run"]["name"] = "bench-async-l3"
    data["env"].update(turn_order=["speaker", "listener"], max_turns=1)
    data["pools"]["large"] = dict(data["pools"]["a"], model_path=large)
    data["agents"]["listener"] = dict(data["agents"]["speaker"], pool="large")
    data["algorithm"]["max_staleness"] = staleness
    return timed_run(data, args.warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    args = parse_args(ap, {"tasks": 2, "k": 4, "max_tokens": 4, "steps": 2, "warmup": 1})
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        run(args, Path(tmp))


def run(args, root: Path) -> None:
    model = build_tiny_model(root / "tiny")
    print(
        f"asynchronous AT-GRPO, {args.tasks} tasks x K={args.k}, <= {args.max_tokens} tokens, tiny "
        f"model, CPU float32; trainers on one core, rollout on another, one thread each; "
        f"{args.steps} timed steps after {args.warmup} warm-up"
    )
    sync, asyn = both(l0, str(model), root, args)
    trl = trl_side(str(model), args, root, 2)
    rate = {n: r["samples"] / r["seconds"] for n, r in (("sync", sync), ("async", asyn))}
    print(
        f"{'L0':<22} {'samples/s':>9} {'rollout busy':>12} {'trainer busy':>12} "
        f"{'staleness max':>13}"
    )
    for name, r in (("max_staleness 0", sync), ("max_staleness 1", asyn)):
        print(
            f"{name:<22} {r['samples'] / r['seconds']:>9.1f} {r['rollout_busy']:>12.2f} "
            f"{r['pools']['a']['busy']:>12.2f} {r['staleness_max']:>13}"
        )
    print(f"{'TRL GRPOTrainer, 2 thr':<22} {trl.rate:>9.1f}")
    print(
        f"async / sync {rate['async'] / rate['sync']:.2f}x (target >= 1.6x); async / TRL "
        f"{rate['async'] / trl.rate:.2f}x (target >= 1.5x); sync / TRL "
        f"{rate['sync'] / trl.rate:.2f}x"
    )
    record(
        "async",
        "L0 samples/s, max_staleness 1 vs 0",
        rate["async"] / rate["sync"],
        f"{rate['async']:.1f} vs {rate['sync']:.1f} samples/s, trainer and rollout on separate "
        f"cores",
    )
    record(
        "async",
        "L0 samples/s, max_staleness 1 vs TRL GRPOTrainer",
        rate["async"] / trl.rate,
        f"{rate['async']:.1f} vs {trl.rate:.1f} samples/s (TRL on both cores)",
    )

    large = larger_model(Path(model), root / "large")
    print(
        f"\nL3 relay: speaker on pool 'a' ({params(Path(model)):,} parameters), listener on pool "
        f"'large' ({params(large):,})"
    )
    l3_runs = dict(enumerate(both(l3, str(model), str(large), root, args)))
    print(f"{'L3':<22} {'samples/s':>9} {'a updates/s':>11} {'a busy':>7} {'large busy':>10}")
    for n, r in l3_runs.items():
        print(
            f"{'max_staleness ' + str(n):<22} {r['samples'] / r['seconds']:>9.1f} "
            f"{r['pools']['a']['updates'] / r['seconds']:>11.2f} {r['pools']['a']['busy']:>7.2f} "
            f"{r['pools']['large']['busy']:>10.2f}"
        )
    small_gain = (l3_runs[1]["pools"]["a"]["updates"] / l3_runs[1]["seconds"]) / (
        l3_runs[0]["pools"]["a"]["updates"] / l3_runs[0]["seconds"]
    )
    print(f"the small pool's updates/s, async / sync: {small_gain:.2f}x")
    record(
        "async",
        "L3 small pool updates/s, max_staleness 1 vs 0",
        small_gain,
        "speaker's pool tiny, listener's pool about 4x its parameters",
    )


if __name__ == "__main__":
    main()

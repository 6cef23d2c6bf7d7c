"""End to end: single-agent GRPO samples per second with atgrpo (L0, local mode: the five services
as local processes, driven through the router as `atgrpo train` does) against TRL's GRPOTrainer,
on the same tiny model, prompts, K, lengths, learning rate and reward, CPU, float32, in one run.
Target: >= 1.0x TRL.

The task is the toy env alone (turn_order [speaker], max_turns 1): prompt "speaker: the secret is
3", reward 1 (+0.1 if the answer is exactly the digit) when the answer names the secret. A step is
one generation of tasks x K completions and one optimizer step on all of them, on both sides.
Steady state: the first --warmup steps are skipped, the next --steps are timed (from the end of
the last warm-up step to the end of the last timed step; service start-up and trainer
construction are outside the timed window).

TRL runs in this process, once per --trl-threads value: torch's default intra-op threads (what a
user gets) and 1 thread. On a busy machine the default OpenMP team of one thread per core can be
several times slower for a model this small, so the headline ratio is against the fastest TRL
run. TRL's "rollout" is _generate_and_score_completions (generation, reward, advantages); its
weights need no sync (one model in one process). atgrpo's phases are the router's step metrics,
and a line below the table splits them further (the rollout engines' own generation time and
batch count, from their Prometheus metrics; the trainer's own update time).

    python bench/e2e.py [--tasks 16] [--k 8] [--max-tokens 16] [--steps 6] [--warmup 2] [--rounds 1]
                         [--lr 1e-5] [--trl-threads 0,1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record  # noqa: E402

from atgrpo.models import build_tiny_model  # noqa: E402

SEED = 0


@dataclass
class Side:
    """One side's timed window: samples and seconds over the measured steps, and where they went."""

    name: str
    samples: int = 0
    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)  # phase -> seconds over the window
    tokens_per_sample: float = 0.0  # response tokens, mean
    cpu: float = 0.0  # CPU seconds (all processes) over the window
    notes: dict[str, float] = field(default_factory=dict)  # finer figures one side has

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


# ---- atgrpo ------------------------------------------------------------------------------------


def atgrpo_config(model_dir: str, run_dir: Path, args) -> dict:
    return {
        "run": {
            "name": "bench-e2e-l0",
            "seed": SEED,
            "steps": args.warmup + args.steps,
            "tasks_per_step": args.tasks,
            "eval_every_steps": 0,
            "eval_tasks": 0,
            "checkpoint_every_steps": 0,
            "save_samples": False,
            "run_dir": str(run_dir),
        },
        "env": {"name": "toy", "turn_order": ["speaker"], "max_turns": 1},
        "pools": {
            "a": {
                "model_path": model_dir,
                "engine": "hf",
                "device": "cpu",
                "dtype": "float32",
                "optim": {
                    "lr": args.lr,
                    "warmup_steps": 0,
                    "min_lr_ratio": 1.0,
                    "weight_decay": 0.0,
                },
            }
        },
        "agents": {
            "speaker": {
                "pool": "a",
                "train_sampling": {"temperature": 1.0, "max_tokens": args.max_tokens},
                "eval_sampling": {"max_tokens": args.max_tokens},
            }
        },
        # One optimizer step per training step, on every sample of the step.
        "algorithm": {"k": args.k, "mini_batch_size": args.tasks * args.k},
    }


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (all their threads)."""
    import psutil

    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def engine_totals(metrics_addresses: list[str]) -> tuple[float, float]:
    """(seconds, batches) the rollout replicas' engines have spent generating so far, from their
    Prometheus histogram atgrpo_rollout_generate_seconds."""
    import re
    import urllib.request

    seconds = batches = 0.0
    for address in metrics_addresses:
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
        for what, value in re.findall(
            r"^atgrpo_rollout_generate_seconds_(sum|count)\{[^}]*\} (\S+)$", text, re.M
        ):
            if what == "sum":
                seconds += float(value)
            else:
                batches += float(value)
    return seconds, batches


class _Sink:
    """drive()'s reporter: notes the services' CPU time and the rollout engines' generation time
    at the end of the last warm-up step and of the last step, so they cover the timed window."""

    def __init__(self, pids: list[int], rollout_metrics: list[str], marks: tuple[int, int]):
        self.pids, self.rollout_metrics, self.marks = pids, rollout_metrics, marks
        self.cpu: dict[int, float] = {}
        self.engine: dict[int, tuple[float, float]] = {}

    def start(self, status):
        pass

    def on_event(self, event):
        if event["kind"] == "step" and event["step"] in self.marks:
            self.cpu[event["step"]] = cpu_seconds(self.pids)
            self.engine[event["step"]] = engine_totals(self.rollout_metrics)


def atgrpo_side(model_dir: str, args, root: Path) -> Side:
    from atgrpo.cli import launcher
    from atgrpo.cli.runner import LocalServices, drive
    from atgrpo.config import parse_config
    from atgrpo.rundir import read_metrics

    run_dir = Path(tempfile.mkdtemp(prefix="atgrpo-", dir=root)) / "run"
    cfg = parse_config(atgrpo_config(model_dir, run_dir, args))
    services = LocalServices(cfg)
    with services as running:
        started = launcher.read_state(services.state_dir)
        sink = _Sink(
            [s.pid for s in started],
            [s.metrics_address for s in started if s.kind == "rollout"],
            (args.warmup, args.warmup + args.steps),
        )
        final = asyncio.run(drive(running, sink))
    if final["state"] != "finished":
        raise RuntimeError(f"the atgrpo run did not finish: {final}")
    steps = [e for e in read_metrics(run_dir / "metrics.jsonl") if e["kind"] == "step"]
    timed = steps[args.warmup :]
    side = Side("atgrpo")
    # Wall time between step records: the whole loop (collect, group, train, sync, bookkeeping).
    side.seconds = timed[-1]["time"] - steps[args.warmup - 1]["time"]
    side.samples = sum(a["samples"] for e in timed for a in e["agents"].values())
    rollout = sum(e["rollout_seconds"] for e in timed)
    train = sum(e["train_seconds"] for e in timed)
    sync = sum(e["weight_sync_seconds"] for e in timed)
    side.parts = {
        "rollout": rollout,
        "train": train,
        "weight sync": sync,
        "other": side.seconds - rollout - train - sync,
    }
    tokens = sum(p.get("tokens", 0) for e in timed for p in e["pools"].values())
    side.tokens_per_sample = tokens / side.samples if side.samples else 0.0  # response tokens
    first, last = args.warmup, args.warmup + args.steps
    side.cpu = sink.cpu[last] - sink.cpu[first]
    side.notes = {
        "engine_seconds": sink.engine[last][0]
        - sink.engine[first][0],  # generation inside the replica
        "engine_batches": sink.engine[last][1] - sink.engine[first][1],
        "trainer_seconds": sum(
            p.get("train_seconds", 0.0) for e in timed for p in e["pools"].values()
        ),
    }
    return side


# ---- TRL ---------------------------------------------------------------------------------------


def toy_rows(args) -> list[dict]:
    """The prompts atgrpo's router would draw, step by step, as chat messages, with their tasks."""
    from env_svc.envs.toy import ToyEnv
    from router_svc.steps import step_tasks

    env = ToyEnv({"turn_order": ["speaker"], "max_turns": 1})
    rows = []
    for step in range(args.warmup + args.steps):
        for t in step_tasks(SEED, step, args.tasks, "train"):
            env.reset(t.task_id, t.seed, t.split)
            rows.append(
                {
                    "prompt": env.observe("speaker"),
                    "task_id": t.task_id,
                    "seed": t.seed,
                    "split": t.split,
                }
            )
    return rows


def toy_reward(prompts, completions, task_id, seed, split, **_):
    """The toy env's own rule: alpha * team + local (alpha 1), for the speaker acting alone."""
    from env_svc.envs.toy import ToyEnv

    env = ToyEnv({"turn_order": ["speaker"], "max_turns": 1})
    out = []
    for c, tid, s, sp in zip(completions, task_id, seed, split, strict=True):
        env.reset(tid, s, sp)
        r = env.step("speaker", c[-1]["content"] if isinstance(c, list) else c)
        out.append(r.team_reward + r.local_reward)
    return out


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def trl_side(model_dir: str, args, root: Path, threads: int) -> Side:
    """TRL's GRPOTrainer in this process, with `threads` torch intra-op threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _trl_side(model_dir, args, root)
    finally:
        torch.set_num_threads(before)


def _trl_side(model_dir: str, args, root: Path) -> Side:
    import psutil
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.disable_progress_bar()

    total = args.warmup + args.steps
    batch = args.tasks * args.k
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-", dir=root),
        max_steps=total,
        seed=SEED,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=args.k,
        num_iterations=1,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="bnpo",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        report_to=[],
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=cfg,
        reward_funcs=toy_reward,
        train_dataset=Dataset.from_list(toy_rows(args)),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )

    me = psutil.Process()
    ends: list[float] = []
    cpu: list[float] = []
    lengths: list[float] = []
    gen: list[float] = []
    generate = trainer._generate_and_score_completions

    def timed_generate(*a, **kw):  # generation, reward and advantages: TRL's rollout phase
        t = time.perf_counter()
        out = generate(*a, **kw)
        gen.append(time.perf_counter() - t)
        return out

    trainer._generate_and_score_completions = timed_generate

    class StepEnds(TrainerCallback):
        def on_step_end(self, *a, **kw):
            ends.append(time.perf_counter())
            t = me.cpu_times()
            cpu.append(t.user + t.system)
            lengths.append(trainer._metrics["train"]["completions/mean_length"][-1])

    trainer.add_callback(StepEnds())
    with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its final metrics
        trainer.train()
    if len(ends) != total or len(gen) != total:
        raise RuntimeError(
            f"TRL ran {len(ends)} steps with {len(gen)} generations, expected {total}"
        )
    side = Side("TRL")
    side.seconds = ends[-1] - ends[args.warmup - 1]
    side.samples = batch * args.steps
    rollout = sum(gen[args.warmup :])
    side.parts = {
        "rollout": rollout,
        "train": side.seconds - rollout,
        "weight sync": 0.0,
        "other": 0.0,
    }
    side.tokens_per_sample = statistics.fmean(lengths[args.warmup :])
    side.cpu = cpu[-1] - cpu[args.warmup - 1]
    return side


# ---- the table ---------------------------------------------------------------------------------


def total(name: str, sides: list[Side]) -> Side:
    return Side(
        name,
        sum(s.samples for s in sides),
        sum(s.seconds for s in sides),
        {k: sum(s.parts[k] for s in sides) for k in sides[0].parts},
        statistics.fmean(s.tokens_per_sample for s in sides),
        sum(s.cpu for s in sides),
        {k: sum(s.notes[k] for s in sides) for k in sides[0].notes},
    )


def row(label: str, side: Side, steps: int, atgrpo_rate: float | None = None) -> str:
    per = {k: v / steps for k, v in side.parts.items()}
    ratio = f"{atgrpo_rate / side.rate:6.2f}x" if atgrpo_rate else f"{'':>7}"
    return (
        f"{label:<6} {side.name:<16} {side.rate:9.1f} {side.seconds / steps:7.2f} "
        f"{per['rollout']:8.2f} {per['train']:6.2f} {per['weight sync']:5.2f} {per['other']:6.2f} "
        f"{side.cpu / steps:10.2f} {side.tokens_per_sample:7.1f}  {ratio}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=16, help="prompts per step")
    ap.add_argument("--k", type=int, default=8, help="completions per prompt (GRPO group size)")
    ap.add_argument("--max-tokens", type=int, default=16, help="max new tokens per completion")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per side and round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument(
        "--rounds", type=int, default=1, help="repeat every side, reversing the order each round"
    )
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument(
        "--trl-threads",
        default="0,1",
        help="torch intra-op threads for TRL's runs, comma-separated (0: torch's default); "
        "the headline ratio is against the fastest",
    )
    args = parse_args(
        ap, smoke={"tasks": 2, "k": 2, "max_tokens": 4, "steps": 1, "warmup": 1, "trl_threads": "1"}
    )
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be at least 1")
    default_threads = torch_threads()
    trl_threads = list(
        dict.fromkeys(int(t) or default_threads for t in args.trl_threads.split(","))
    )
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        run(args, trl_threads, Path(tmp))


def run(args, trl_threads: list[int], root: Path) -> None:
    model_dir = str(build_tiny_model(root / "tiny"))
    print(
        f"single-agent GRPO end to end (L0, toy env), tiny model, CPU float32, {os.cpu_count()} "
        f"cores: {args.tasks} prompts x K={args.k} = {args.tasks * args.k} samples and one "
        f"optimizer step per step, <= {args.max_tokens} new tokens; {args.steps} timed steps after "
        f"{args.warmup} warm-up, per side"
    )
    print(
        f"{'round':<6} {'side':<16} {'samples/s':>9} {'s/step':>7} {'rollout':>8} {'train':>6} "
        f"{'sync':>5} {'other':>6} {'cpu-s/step':>10} {'tok/smp':>7}  {'atgrpo/x':>7}"
    )
    runs: dict[str, list[Side]] = {}
    jobs = [
        (f"TRL {n} thread{'s' if n > 1 else ''}", lambda n=n: trl_side(model_dir, args, root, n))
        for n in trl_threads
    ]
    jobs.append(("atgrpo", lambda: atgrpo_side(model_dir, args, root)))
    for r in range(args.rounds):
        got = {}
        for name, job in jobs if r % 2 == 0 else jobs[::-1]:
            got[name] = job()
            got[name].name = name
            runs.setdefault(name, []).append(got[name])
        for name in (j[0] for j in jobs):
            print(
                row(
                    str(r + 1),
                    got[name],
                    args.steps,
                    got["atgrpo"].rate if name != "atgrpo" else None,
                ),
                flush=True,
            )
    totals = {name: total(name, sides) for name, sides in runs.items()}
    ours = totals.pop("atgrpo")
    best = max(totals.values(), key=lambda s: s.rate)
    ratio = ours.rate / best.rate
    if args.rounds > 1:
        for side in [*totals.values(), ours]:
            print(
                row("all", side, args.steps * args.rounds, ours.rate if side is not ours else None)
            )
    n = args.steps * args.rounds
    engine, batches = ours.notes["engine_seconds"] / n, ours.notes["engine_batches"] / n
    print(
        f"atgrpo per step: rollout {ours.parts['rollout'] / n:.2f}s = engine generation "
        f"{engine:.2f}s in {batches:.1f} batches + env/RPC/streaming "
        f"{ours.parts['rollout'] / n - engine:.2f}s; train {ours.parts['train'] / n:.2f}s = update "
        f"in the trainer {ours.notes['trainer_seconds'] / n:.2f}s + sample transfer "
        f"{(ours.parts['train'] - ours.notes['trainer_seconds']) / n:.2f}s"
    )
    print(
        f"atgrpo {ours.rate:.1f} samples/s vs TRL GRPOTrainer's best ({best.name}) "
        f"{best.rate:.1f}: {ratio:.2f}x (target >= 1.0x)"
    )
    record(
        "e2e",
        "L0 GRPO samples/s vs TRL GRPOTrainer",
        ratio,
        f"{args.tasks}x{args.k} samples/step, {args.max_tokens} tokens, tiny model CPU: "
        f"{ours.rate:.1f} vs {best.rate:.1f} samples/s ({best.name})",
    )


if __name__ == "__main__":
    main()

"""The paper's claims in miniature: AT-GRPO against its ablations, measured on this system.

Every run trains the same model on the same task for the same number of steps through the real
services (`atgrpo train`'s local mode); only the variant's change to the config differs.

Tasks, on the toy relay (env_svc/envs/toy.py), from the tiny model taught the code's pairs but
not their direction (atgrpo.models.taught.code_pairs_model: told 3, it says 3 or 7):
  relay  the plain relay, two turns: the speaker must say the secret, the listener repeat it;
  code   the relay under the code 5678, one turn: the speaker encodes (3 -> 7) and the listener
         decodes (7 -> 3), opposite skills from the same start.
Variants:
  at-grpo     tree sampling, groups (task, agent, turn), alpha 1, one shared model (L1)
  trajectory  trajectory-level GRPO: K independent episodes a task, groups (task, agent), every
              turn's sample gets its episode's return (algorithm.grouping: trajectory)
  alpha0      AT-GRPO without the team reward (algorithm.alpha: 0)
  L0          the speaker alone must answer the secret (env.turn_order: [speaker]): both roles'
              work, as encoding then decoding is the identity
  L2          AT-GRPO with one LoRA adapter per role (rank 16, lr 3e-3) on the frozen model
  L2-equal    L2 at the rank whose two adapters hold as many parameters as the whole model that
              L1 trains (rank 96 on the tiny model; alpha / rank kept at 2)
Equal work: K = 8 branches, temperature 1, at most 4 new tokens, one optimizer step a step; 8
tasks a step, 16 for L0, whose episodes have one agent's samples, not two. The tokens each
variant trained a step are measured and printed beside its success.

Success is evaluated every --eval-every steps on --eval-tasks eval tasks (128), sampled at the
training temperature (a greedy evaluation of four secrets moves in steps of 1/4), and once more
greedily from the last step's checkpoint. The speaker's final return tells which protocol a team
learnt on the code task: 0.6 when it encodes (3 -> 7), 0 when it says the secret itself and the
listener echoes it, which the environment also counts as solved. Output: a table (stdout and
OUT/ablations.md), the curves (OUT/ablations.png) and every figure (OUT/ablations.json).

    python bench/ablations.py [--seeds 0,1,2] [--steps 80] [--eval-every 10] [--eval-tasks 128]
                              [--tasks relay,code]
                              [--variants at-grpo,trajectory,alpha0,L0,L2,L2-equal] [--jobs 2]
                              [--model DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atgrpo.config import LoraConfig  # noqa: E402
from atgrpo.models.taught import TOY_CODE  # noqa: E402
from bench._report import SMOKE, choices, plot_panels  # noqa: E402

K, TASKS_PER_STEP, EVAL_TASKS = 8, 8, 128
SAMPLING = {"temperature": 1.0, "max_tokens": 4}
TASKS = {"relay": {"max_turns": 2}, "code": {"max_turns": 1, "options": {"code": TOY_CODE}}}
VARIANTS = ("at-grpo", "trajectory", "alpha0", "L0", "L2", "L2-equal")
LORA_LR, FULL_LR = 3e-3, 5e-4


def lora_rank(variant: str, equal_rank: int) -> int:
    """An L2 variant's adapter rank: LoraConfig's default, or `equal_rank` for L2-equal."""
    return equal_rank if variant == "L2-equal" else LoraConfig().rank


def run_config(
    task: str,
    variant: str,
    seed: int,
    model: str,
    run_dir: Path,
    steps: int,
    eval_every: int,
    equal_rank: int,
    eval_tasks: int,
) -> dict:
    """The config of one run: the AT-GRPO baseline with `variant`'s one change."""
    agents = ["speaker"] if variant == "L0" else ["speaker", "listener"]
    pool: dict[str, Any] = {
        "model_path": model,
        "device": "cpu",
        "dtype": "float32",
        "optim": {"lr": FULL_LR, "warmup_steps": 0, "min_lr_ratio": 1.0},
    }
    if variant.startswith("L2"):
        rank = lora_rank(variant, equal_rank)
        pool.update(
            specialization="lora",
            lora={"rank": rank, "alpha": 2.0 * rank},
            optim={**pool["optim"], "lr": LORA_LR},
        )
    algorithm = {
        "k": K,
        "alpha": 0.0 if variant == "alpha0" else 1.0,
        "mini_batch_size": 1024,  # one step a step
        "grouping": "trajectory" if variant == "trajectory" else "turn",
    }
    return {
        "run": {
            "name": f"ablation-{task}-{variant.lower()}-{seed}",
            "seed": seed,
            "steps": steps,
            "tasks_per_step": TASKS_PER_STEP * (2 if variant == "L0" else 1),
            "eval_every_steps": eval_every,
            "eval_tasks": eval_tasks,
            "checkpoint_every_steps": steps,
            "run_dir": str(run_dir),
        },
        "env": {"name": "toy", "turn_order": agents, **TASKS[task]},
        "pools": {"shared": pool},
        "agents": {
            a: {"pool": "shared", "train_sampling": SAMPLING, "eval_sampling": SAMPLING}
            for a in agents
        },
        "algorithm": algorithm,
    }


def one_run(
    task: str,
    variant: str,
    seed: int,
    model: str,
    work: str,
    steps: int,
    eval_every: int,
    equal_rank: int,
    eval_tasks: int,
) -> dict:
    """Train one variant on one task; its evaluations and what it trained a step."""
    from atgrpo.cli.runner import LocalServices, evaluate, run_until
    from atgrpo.config import parse_config
    from atgrpo.rundir import read_metrics

    run_dir = Path(work) / f"{task}-{variant}-{seed}"
    data = run_config(
        task, variant, seed, model, run_dir, steps, eval_every, equal_rank, eval_tasks
    )
    start = time.perf_counter()
    with LocalServices(parse_config(data)) as running:
        # to the end; metrics.jsonl has it all
        final = asyncio.run(run_until(running, lambda _event: False))
    if final["state"] != "finished":
        raise RuntimeError(f"{task}/{variant}/seed {seed} ended {final['state']}: {final}")
    for agent in data["agents"].values():
        agent["eval_sampling"] = {"max_tokens": SAMPLING["max_tokens"]}  # greedy
    greedy = evaluate(parse_config(data), run_dir)  # its last checkpoint
    events = read_metrics(run_dir / "metrics.jsonl")
    steps_ = [e for e in events if e["kind"] == "step"]
    evals = [e for e in events if e["kind"] == "eval"]
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        "wall_s": time.perf_counter() - start,
        "evals": [(e["step"], e["success_rate"]) for e in evals],
        "speaker_return": evals[-1]["agents"]["speaker"]["reward_mean"],
        "greedy": greedy["success_rate"],
        "tokens_per_step": statistics.fmean(
            sum(p.get("tokens", 0.0) for p in e["pools"].values()) for e in steps_
        ),
        "samples_per_step": statistics.fmean(
            sum(a["samples"] for a in e["agents"].values()) for e in steps_
        ),
    }


def trainable_params(model: str) -> tuple[int, int]:
    """(the whole model's parameters, which L1 trains; one rank-1 adapter's on LoraConfig's
    modules)."""
    import torch
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    whole = sum(p.numel() for p in full.parameters())
    peft = get_peft_model(full, PeftLora(r=1, target_modules=list(LoraConfig().target_modules)))
    return whole, sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n)


def trainable(variant: str, whole: int, per_rank: int, equal_rank: int) -> int:
    """What `variant` trains: the whole model, or two adapters (speaker's, listener's)."""
    if variant.startswith("L2"):
        return 2 * per_rank * lora_rank(variant, equal_rank)
    return whole


def summarise(runs: list[dict], trained: dict[str, int]) -> list[dict]:
    """One row per (task, variant): success at each evaluation (mean over seeds, and each
    seed's)."""
    rows = []
    for task in dict.fromkeys(r["task"] for r in runs):
        for variant in dict.fromkeys(r["variant"] for r in runs if r["task"] == task):
            mine = sorted(
                (r for r in runs if r["task"] == task and r["variant"] == variant),
                key=lambda r: r["seed"],
            )
            steps = [s for s, _ in mine[0]["evals"]]
            curve = [statistics.fmean(dict(r["evals"])[s] for r in mine) for s in steps]
            rows.append(
                {
                    "task": task,
                    "variant": variant,
                    "seeds": [r["seed"] for r in mine],
                    "steps": steps,
                    "success": curve,
                    "per_seed_final": [r["evals"][-1][1] for r in mine],
                    "speaker_return": statistics.fmean(r["speaker_return"] for r in mine),
                    "greedy": statistics.fmean(r["greedy"] for r in mine),
                    "per_seed_greedy": [r["greedy"] for r in mine],
                    "area": statistics.fmean(curve[1:]) if len(curve) > 1 else curve[0],
                    "tokens_per_step": statistics.fmean(r["tokens_per_step"] for r in mine),
                    "samples_per_step": statistics.fmean(r["samples_per_step"] for r in mine),
                    "trainable": trained[variant],
                    "wall_s": statistics.fmean(r["wall_s"] for r in mine),
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    head = (
        "| task | variant | success at step 0 | final success (mean; per seed) | mean success "
        "after step 0 | final greedy success (mean; per seed) | speaker's final return | trained "
        "tokens / step | samples / step | trainable params | s / run |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        seeds = ", ".join(f"{v:.2f}" for v in r["per_seed_final"])
        greedy = ", ".join(f"{v:.2f}" for v in r["per_seed_greedy"])
        lines.append(
            f"| {r['task']} | {r['variant']} | {r['success'][0]:.2f} | {r['success'][-1]:.2f} "
            f"({seeds}) | {r['area']:.2f} | {r['greedy']:.2f} ({greedy}) | "
            f"{r['speaker_return']:.2f} | {r['tokens_per_step']:.0f} | {r['samples_per_step']:.0f} "
            f"| {r['trainable']:,} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    seeds = len(rows[0]["seeds"])
    panels = {
        task: [(r["variant"], r["steps"], r["success"]) for r in rows if r["task"] == task]
        for task in dict.fromkeys(r["task"] for r in rows)
    }
    plot_panels(
        {f"{task} (mean of {seeds} seeds)": c for task, c in panels.items()},
        path,
        "step",
        "eval success (sampled, T=1)",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0" if SMOKE else "0,1,2")
    ap.add_argument("--steps", type=int, default=2 if SMOKE else 80)
    ap.add_argument("--eval-every", type=int, default=1 if SMOKE else 10)
    # Smoke: a few eval tasks still take every evaluation's path (sampled and greedy).
    ap.add_argument("--eval-tasks", type=int, default=8 if SMOKE else EVAL_TASKS)
    ap.add_argument("--tasks", default="code" if SMOKE else ",".join(TASKS))
    ap.add_argument("--variants", default="at-grpo,L2" if SMOKE else ",".join(VARIANTS))
    ap.add_argument(
        "--jobs", type=int, default=2, help="runs at once (each is five service processes)"
    )
    ap.add_argument(
        "--model",
        help="a model taught the pairs already (default: taught from the tiny model here)",
    )
    ap.add_argument("--out", default=str(ROOT / "runs" / "ablations"))
    args = ap.parse_args()
    tasks = choices(ap, args.tasks, TASKS, "task")
    variants = choices(ap, args.variants, VARIANTS, "variant")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ablations-") as work:
        model = args.model or taught_model(Path(work))
        whole, per_rank = trainable_params(model)
        equal_rank = round(whole / (2 * per_rank))
        trained = {v: trainable(v, whole, per_rank, equal_rank) for v in variants}
        jobs = [
            (t, v, int(s), model, work, args.steps, args.eval_every, equal_rank, args.eval_tasks)
            for s in args.seeds.split(",")
            for t in tasks
            for v in variants
        ]
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = []
            for run in pool.map(one_run, *zip(*jobs, strict=True)):
                print(
                    f"{run['task']:>6} {run['variant']:>10} seed {run['seed']}: "
                    + " ".join(f"{s}:{v:.2f}" for s, v in run["evals"])
                    + f"  ({run['wall_s']:.0f} s)",
                    flush=True,
                )
                runs.append(run)
    rows = summarise(runs, trained)
    text = table(rows)
    took = time.perf_counter() - start
    print(f"\n{text}\n\n{len(runs)} runs in {took / 60:.1f} min")
    (out / "ablations.md").write_text(text + "\n")
    (out / "ablations.json").write_text(
        json.dumps({"args": vars(args), "minutes": took / 60, "rows": rows, "runs": runs}, indent=1)
    )
    plot(rows, out / "ablations.png")


def taught_model(work: Path) -> str:
    from atgrpo.models import build_tiny_model
    from atgrpo.models.taught import code_pairs_model

    return code_pairs_model(str(build_tiny_model(work / "tiny")), work / "pairs")


if __name__ == "__main__":
    main()

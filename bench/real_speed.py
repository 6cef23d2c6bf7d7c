"""Where a real model's step goes on CPU, in one run on SmolLM2-135M-Instruct: the trainer service's
bf16 update (its own path, PoolOps) against a 1024^3 bf16 matmul and against how it ran before
issue 55 (autocast's per-projection casts, AdamW's per-weight loop), the update with each group's
prompt shared against the unshared update, the update's micro-batches packed by length
against arrival order (positions computed for a mixed step), the update under bf16 autocast,
generation against this process's matmul rate, against a decode step's own matmuls (every weight
once at the decode's rows: what its shapes allow) and against transformers' own sdpa attention,
generation with bf16 weights, the service's generation rate in the learning bench's mix with the
continuous batch against one fixed batch at a time and the engine's fixed batches
(bench/_serve_speed.py), and one step of bench/real_learning.py's AT-GRPO config (bf16)
through the five services.

    python bench/real_speed.py [--model DIR] [--groups 4] [--k 4] [--prompt 96] [--response 32]
                               [--gen-prompts 8] [--gen-prompt 200] [--gen-tokens 64] [--no-step]
                               [--update-reps 3] [--update-only]

Targets (issue 35): update FLOPs per trained response token cut >= 2x at K = 4 with prompts 3x
longer than their answers (counted by torch's FlopCounterMode over the forward and backward, not
assumed); generation >= 60% of the measured matmul rate; one step of the learning bench's
config <= 60 s when nothing else runs (it prints the step's breakdown: what stands in the way).
Issue 55: service generation with the continuous batch >= 2x one batch at a time and >= 75% of the
engine's fixed-batch rate; the bf16 update >= 35% of the bf16 matmul rate (FLOPs counted by
FlopCounterMode).

The update's measures live in bench/_update_speed.py, generation's in bench/_gen_speed.py and the
service-level one in bench/_serve_speed.py; this file runs them, prints and records the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from atgrpo.perf import matmul_rate  # noqa: E402
from bench._gen_speed import decode_matmul_rate, generation  # noqa: E402
from bench._report import SMOKE, parse_args, record  # noqa: E402
from bench._update_speed import (  # noqa: E402
    arrival_packing,
    grouped,
    mixed_step,
    service_update,
    update_pass,
)
from trainer_svc.packing import MICRO_BATCH_OVERHEAD, pack, padded_size  # noqa: E402

# The service mix at smoke size (bench/_serve_speed.py): the same code paths, a few tokens.
SERVE_SMOKE = {
    "tasks": 3,
    "k": 2,
    "tool_tokens": 6,
    "reasoner_tokens": 4,
    "prompt": 12,
    "env_s": (0.01, 0.05),
}
DTYPE = "bfloat16"  # the learning bench's pool dtype (bench/real_learning.py)


def report_service_update(path: str, reps: int) -> None:
    """Prints and records service_update's figures (issue 55: the bf16 update >= 35% of the bf16
    matmul rate)."""
    u = service_update(path, reps)
    square = u["square_bf16"]
    print(
        f"the service's bf16 update of a mixed step (48 samples), median of {reps}, against a "
        f"1024^3 bf16 matmul ({square / 1e9:.0f} GFLOP/s in this process):"
    )
    for variant in ("before", "now"):
        t = u[f"{variant}_update_s"]
        print(
            f"  {variant:>6}: {t:6.2f} s (forward {u[f'{variant}_time_forward_s']:.2f}, backward "
            f"{u[f'{variant}_time_backward_s']:.2f}, optimizer "
            f"{u[f'{variant}_time_optimizer_s']:.2f}), {u['flops'] / t / 1e9:.0f} GFLOP/s = "
            f"{u['flops'] / t / square:.0%} of the bf16 matmul; update_mfu "
            f"{u[f'{variant}_mfu']:.2f}"
        )
    record(
        "real_speed",
        "bf16 update FLOP/s / 1024^3 bf16 matmul rate (the service's path)",
        u["flops"] / u["now_update_s"] / square,
        f"target >= 0.35; {u['now_update_s']:.2f} s, before "
        f"{u['flops'] / u['before_update_s'] / square:.0%}",
    )
    record(
        "real_speed",
        "bf16 update seconds, before / now (norm casts, fused AdamW)",
        u["before_update_s"] / u["now_update_s"],
        f"{u['before_update_s']:.2f} s -> {u['now_update_s']:.2f} s",
    )


def one_step(model: str, work: Path) -> dict:
    """One training step (no evaluation) of bench/real_learning.py's AT-GRPO arithmetic run."""
    from atgrpo.cli.runner import LocalServices, run_until
    from atgrpo.config import parse_config
    from atgrpo.rundir import read_metrics
    from bench._learning_config import run_config

    data = run_config(
        "arithmetic", "at-grpo", model, work / "step", steps=1, eval_every=0, eval_tasks=8
    )
    with LocalServices(parse_config(data)) as running:
        asyncio.run(run_until(running, lambda _event: False))
    return next(e for e in read_metrics(work / "step" / "metrics.jsonl") if e["kind"] == "step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        help="default: .atgrpo/models/smollm2 (built when missing); the tiny model in smoke mode",
    )
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--response", type=int, default=32)
    ap.add_argument("--gen-prompts", type=int, default=8)
    ap.add_argument(
        "--gen-prompt", type=int, default=200, help="mean prompt tokens of the generation measure"
    )
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument(
        "--no-step", action="store_true", help="skip the one-step run through the services"
    )
    ap.add_argument(
        "--update-reps", type=int, default=3, help="timings of the service's bf16 update, each way"
    )
    ap.add_argument(
        "--update-only", action="store_true", help="time the service's bf16 update and stop"
    )
    args = parse_args(
        ap,
        {
            "groups": 2,
            "prompt": 24,
            "response": 8,
            "gen_prompts": 2,
            "gen_prompt": 16,
            "gen_tokens": 8,
            "no_step": True,
            "update_reps": 1,
        },
    )
    from transformers import AutoModelForCausalLM

    from atgrpo.malloc import keep_freed_memory

    keep_freed_memory()  # as the rollout and trainer services run (atgrpo.malloc)
    with tempfile.TemporaryDirectory(prefix="real-speed-") as tmp:
        work = Path(tmp)
        if args.model:
            path = args.model
        elif SMOKE:
            from atgrpo.models import build_tiny_model

            path = str(build_tiny_model(work / "tiny"))
        else:
            from bench.real_learning import DEFAULT_MODEL, ensure_smollm2

            path = ensure_smollm2(DEFAULT_MODEL)
        report_service_update(path, args.update_reps)
        if args.update_only:
            return
        rate = matmul_rate("cpu", torch.float32)
        print(f"matmul rate (float32, this process): {rate / 1e9:.1f} GFLOP/s")

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.train()
        samples = grouped(args.groups, args.k, args.prompt, args.response, model.config.vocab_size)
        trained = len(samples) * args.response
        (f_plain, t_plain), (f_shared, t_shared) = (
            update_pass(model, samples, s) for s in (False, True)
        )
        print(
            f"update, {args.groups} groups x K {args.k}, prompt {args.prompt} / response "
            f"{args.response} tokens:"
        )
        for name, f, t in (("unshared", f_plain, t_plain), ("shared", f_shared, t_shared)):
            print(
                f"  {name:>8}: {f / trained / 1e9:6.2f} GFLOP per trained token, {t:6.2f} s, "
                f"{f / t / rate:.0%} of the matmul rate"
            )
        record(
            "real_speed",
            f"update FLOPs per response token, unshared / shared (K={args.k}, prompt "
            f"{args.prompt // args.response}x)",
            f_plain / f_shared,
            f"target >= 2; {f_shared / trained / 1e9:.2f} GFLOP/token shared",
        )
        record(
            "real_speed",
            "update seconds, unshared / shared",
            t_plain / t_shared,
            f"{t_shared:.2f} s shared",
        )
        record("real_speed", "update FLOP/s / matmul rate (shared)", f_shared / t_shared / rate, "")
        # A pool's `dtype: bfloat16` (autocast over float32 masters): on a CPU with bf16 matrix
        # instructions its matmuls run ~2.5x float32's (AMD EPYC, avx512_bf16, measured here).
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, t_bf16 = update_pass(model, samples, True)
        print(f"  bf16 autocast (shared): {t_bf16:6.2f} s")
        record(
            "real_speed",
            "update seconds, float32 / bf16 autocast (shared)",
            t_shared / t_bf16,
            f"{t_bf16:.2f} s under bf16 autocast",
        )
        mixed = mixed_step()
        sizes = {
            name: sum(
                padded_size([mixed[r] for r in m], True) + MICRO_BATCH_OVERHEAD for m in batches
            )
            for name, batches in (
                ("arrival", arrival_packing(mixed, 4096)),
                ("length", pack(range(len(mixed)), mixed, 4096, True)),
            )
        }
        real = sum(len(p) for p in {tuple(s.prompt_ids) for s in mixed}) + sum(
            len(s.response_ids) for s in mixed
        )
        print(
            f"update packing, a mixed step ({real} real positions): arrival order "
            f"{sizes['arrival']}, by length {sizes['length']} (positions + {MICRO_BATCH_OVERHEAD} "
            f"a micro-batch)"
        )
        record(
            "real_speed",
            "update positions, arrival-order packing / length packing",
            sizes["arrival"] / sizes["length"],
            f"{sizes['length']} for {real} real",
        )
        del model

        from rollout_svc.engines.hf import HFEngine

        engine = HFEngine(path, device="cpu", dtype="float32")
        engine.warm_up()
        attention = engine.model.config._attn_implementation
        engine.model.set_attn_implementation("sdpa")  # transformers' own: the baseline
        f_stock, t_stock = generation(
            engine, args.gen_prompts, args.k, args.gen_prompt, args.gen_tokens
        )
        engine.model.set_attn_implementation(attention)
        f_gen, t_gen = generation(
            engine, args.gen_prompts, args.k, args.gen_prompt, args.gen_tokens
        )
        ceiling = decode_matmul_rate(engine.model, args.gen_prompts * args.k)
        del engine
        print(
            f"generation, {args.gen_prompts} prompts of ~{args.gen_prompt} tokens x {args.k}: "
            f"{f_gen / t_gen / 1e9:.1f} GFLOP/s, {f_gen / t_gen / rate:.0%} of the matmul rate "
            f"({t_gen:.2f} s; transformers' sdpa: {t_stock:.2f} s, {f_stock / t_stock / rate:.0%})"
        )
        record(
            "real_speed",
            "generation FLOP/s / matmul rate (hf engine)",
            f_gen / t_gen / rate,
            "target >= 0.6",
        )
        print(
            f"  a decode step's matmuls alone at {args.gen_prompts * args.k} rows: "
            f"{ceiling / 1e9:.1f} GFLOP/s, {ceiling / rate:.0%} of the matmul rate; generation "
            f"is {f_gen / t_gen / ceiling:.0%} of that"
        )
        record(
            "real_speed",
            "a decode step's matmuls alone / matmul rate (float32)",
            ceiling / rate,
            "what the decode's shapes allow: every weight read once for a few rows",
        )
        record(
            "real_speed",
            "generation FLOP/s / a decode step's matmuls alone (float32)",
            f_gen / t_gen / ceiling,
            "",
        )
        record(
            "real_speed",
            f"generation seconds, transformers' sdpa / {attention} (padded prompts)",
            t_stock / t_gen,
            f"{t_gen:.2f} s",
        )
        # A pool's `dtype: bfloat16`: the engine's weights, cache and attention in bf16, its
        # weights packed once for oneDNN (rollout_svc.engines.hf_packed); the baseline, the same
        # engine on torch's own linear.
        b16 = {}
        for packed in (False, True):
            engine = HFEngine(path, device="cpu", dtype="bfloat16", pack_weights=packed)
            engine.warm_up()
            b16[packed] = generation(
                engine, args.gen_prompts, args.k, args.gen_prompt, args.gen_tokens
            )
            del engine
        f_b16, t_b16 = b16[True]
        record(
            "real_speed",
            "generation seconds in bf16, torch's linear / weights packed for oneDNN",
            b16[False][1] / t_b16,
            f"{b16[False][1]:.2f} s -> {t_b16:.2f} s",
        )
        rate_b16 = matmul_rate("cpu", torch.bfloat16)
        print(
            f"generation in bf16: {t_b16:.2f} s, {f_b16 / t_b16 / 1e9:.1f} GFLOP/s: "
            f"{f_b16 / t_b16 / rate:.0%} of the float32 matmul rate, "
            f"{f_b16 / t_b16 / rate_b16:.0%} of bf16's ({rate_b16 / 1e9:.1f} GFLOP/s)"
        )
        record(
            "real_speed",
            "generation seconds, float32 / bf16 weights",
            t_gen / t_b16,
            f"{t_b16:.2f} s in bf16, {f_b16 / t_b16 / rate_b16:.0%} of the bf16 matmul rate",
        )
        record(
            "real_speed",
            "generation FLOP/s in bf16 / float32 matmul rate",
            f_b16 / t_b16 / rate,
            "",
        )

        # The service's rate in the learning bench's mix: requests arriving as the tree driver
        # sends them, through a pool, with the continuous batch and one fixed batch at a time.
        from bench._serve_speed import Mix, measure

        mix = Mix(**(SERVE_SMOKE if SMOKE else {}))
        engine = HFEngine(path, device="cpu", dtype=DTYPE)
        engine.warm_up()
        print(
            f"service generation, {mix.tasks} tasks x K {mix.k} (tool {mix.tool_tokens} then "
            f"reasoner {mix.reasoner_tokens} tokens, staggered), {DTYPE}:"
        )
        serve = measure(engine, mix)
        del engine
        record(
            "real_speed",
            "service generation tokens/s, continuous batch / one batch at a time",
            serve["continuous"] / serve["one_at_a_time"],
            f"target >= 2; {serve['continuous']:.1f} tokens/s continuous",
        )
        record(
            "real_speed",
            "service generation tokens/s, continuous batch / engine's fixed batch",
            serve["continuous"] / serve["fixed_batch"],
            f"target >= 0.75; {serve['fixed_batch']:.1f} tokens/s in fixed batches",
        )

        if not args.no_step:
            step = one_step(path, work)
            keys = [
                k for k in step if k.endswith("_s") or k.endswith("_seconds") or k.endswith("mfu")
            ]
            print(
                "one step of the learning bench's config:",
                json.dumps({k: round(step[k], 3) for k in keys}),
            )
            record(
                "real_speed",
                "one learning step: 60 s / its seconds",
                60.0 / step["step_seconds"],
                f"{step['step_seconds']:.1f} s (target <= 60 s)",
            )


if __name__ == "__main__":
    main()

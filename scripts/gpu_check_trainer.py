"""Parts 1 and 2 of the GPU check (gpu_check.py's docstring says what each measures): the trainer
at a real size, and the rollout engine's log-probs against the trainer's on the same tokens. Both
run the trainer's own code with no grpc, so a bare GPU machine with torch and the model wheels runs
them (tests/trainer/test_gpu_check.py checks that it does).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import gpu_check_parts as parts
from gpu_check_fixtures import (
    ALLOC_CONF,
    _peak,
    _reserved,
    _reset_peak,
    _rss,
    example_pool,
    example_sampling,
    model_config,
    random_model,
    samples_for,
    score,
    setup_pool,
)


def check_trainer(args, work: Path) -> dict:
    """Tokens/s and peak memory of one update at the example's pool settings, with the plan's
    estimate."""
    import torch

    from atgrpo.memory import trainer_components, trainer_peak

    run, name, pool = example_pool(args)
    cfg = model_config(args.size)
    tokens = pool.micro_batch_tokens
    started = time.monotonic()
    # On CPU the peak is the process's: what the trainer holds is the rise over this.
    baseline = 0 if args.device.startswith("cuda") else _rss()
    path = random_model(args, work, "bfloat16" if pool.dtype == "bfloat16" else "float32")
    ops = setup_pool(args, path, name, pool)
    state = ops.state
    loaded_s = time.monotonic() - started
    per_sample = min(args.sample_tokens, tokens)
    samples = samples_for(per_sample, max(1, tokens // per_sample), cfg["vocab_size"])
    # the budget (pool.micro_batch_tokens) and precision are the pool's: state.update_settings
    update = dataclasses.replace(run.update_for(name), mini_batch_size=len(samples))
    ops.train(samples, update)  # warm-up: allocator, AdamW state, kernels
    _reset_peak(args.device)
    t0 = time.monotonic()
    metrics = ops.train(samples, update)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.monotonic() - t0
    measured = _peak(args.device) - baseline
    # The same budget on samples of unequal lengths (padded) under the example's top-k / top-p.
    padded = parts.padded_samples(
        per_sample, len(samples), cfg["vocab_size"], example_sampling(run, name, per_sample)
    )
    p_update = dataclasses.replace(update, mini_batch_size=len(padded))
    t0 = time.monotonic()
    p_metrics = ops.train(padded, p_update)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    p_seconds = time.monotonic() - t0
    estimate = trainer_components(_shape(cfg), pool, run.algorithm, args.device, tokens=tokens)
    return {
        "model": "Qwen3-1.7B (random weights)"
        if args.size == "1.7b"
        else "Qwen3-shaped small (random weights)",
        "pool": name,
        "dtype": pool.dtype,
        "micro_batch_tokens": tokens,
        "samples": len(samples),
        "sample_tokens": per_sample,
        "checkpointing": state.checkpointing,
        "load_s": round(loaded_s, 1),
        "update_s": round(seconds, 2),
        "tokens_per_s": round(sum(len(s.response_ids) for s in samples) / seconds, 1),
        **parts.mfu(metrics, ops.matmul_rate),
        "padded": {
            "samples": len(padded),
            "sample_tokens": [len(s.prompt_ids) + len(s.response_ids) for s in padded],
            "top_k": padded[0].sampling.top_k,
            "top_p": padded[0].sampling.top_p,
            "update_s": round(p_seconds, 2),
            "tokens_per_s": round(sum(len(s.response_ids) for s in padded) / p_seconds, 1),
            **parts.mfu(p_metrics, ops.matmul_rate),
            "loss": p_metrics.get("loss"),
        },
        "peak_bytes": measured,
        "reserved_bytes": _reserved(args.device),
        "alloc_conf": os.environ.get(ALLOC_CONF[0], ""),
        "plan_bytes": trainer_peak(estimate),
        "plan_components": estimate,
        "plan_ratio": round(measured / max(1, trainer_peak(estimate)), 3),
        "loss": metrics.get("loss"),
    }


def _shape(cfg: dict):
    from atgrpo.model_shape import ModelShape

    return ModelShape.from_config(cfg)


def check_logprobs(args, work: Path) -> dict:
    """The rollout's log-probs against the trainer's on the same sampled tokens (step 0: ratio 1),
    on prompts of one length and, padded in one batch, of unequal lengths."""
    import torch

    from atgrpo.contract.trainer import TrainSample
    from rollout_svc.engines.hf import HFEngine

    run, name, pool = example_pool(args)
    sampling = example_sampling(run, name, args.gen_tokens)
    path = random_model(args, work, "bfloat16" if pool.dtype == "bfloat16" else "float32")
    # The rollout's width: bf16 on a GPU (what vLLM serves), float32 on the CPU (the hf engine's).
    engine = HFEngine(
        str(path),
        device=args.device,
        dtype="bfloat16" if args.device.startswith("cuda") else "float32",
    )
    vocab = model_config(args.size)["vocab_size"]
    cases = {}
    for case, unequal in (("equal", False), ("padded", True)):
        prompts = parts.logprob_prompts(vocab, unequal)
        outs = engine.generate(prompts, [2] * len(prompts), sampling)
        cases[case] = [
            TrainSample("a", p, c.token_ids, c.logprobs, 1.0, sampling)
            for p, cs in zip(prompts, outs, strict=True)
            for c in cs
            if c.token_ids
        ]
    del engine
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    ops = setup_pool(args, path, name, pool)
    found = {}
    for case, samples in cases.items():
        rollout = torch.cat([torch.tensor(s.old_logprobs, dtype=torch.float32) for s in samples])
        found[case] = {
            "samples": len(samples),
            **parts.agreement(rollout, torch.cat(score(ops, run, name, samples))),
        }
    return {
        "sampling": dataclasses.asdict(sampling),
        "pool_dtype": pool.dtype,
        "autocast_bf16": ops.state.autocast,
        **found["equal"],
        "padded": {
            **found["padded"],
            "prompt_tokens": [len(s.prompt_ids) for s in cases["padded"][::2]],
        },
    }

"""The generation measures (sections of bench/real_speed.py): the hf engine's FLOPs and seconds on
prompts of spread lengths, and what a decode step's matmuls alone reach at its rows, the ceiling
its shapes allow. real_speed.py holds them against the matmul rate and records the ratios; the
service-level rate in the learning bench's mix is bench/_serve_speed.py's.
"""

from __future__ import annotations

import time

import torch

from atgrpo.contract.sampling import Sampling
from atgrpo.perf import generation_flops


def generation(
    engine, prompts: int, k: int, prompt_tokens: int, new_tokens: int
) -> tuple[float, float]:
    """(FLOPs, seconds) of the hf engine sampling `k` answers to each of `prompts` prompts, whose
    lengths spread from half to 1.5x `prompt_tokens` as a step's do (left-padded: the batch has a
    mask, which prompts of one length would not)."""
    g = torch.Generator().manual_seed(1)
    lengths = [round(prompt_tokens * (0.5 + i / max(1, prompts - 1))) for i in range(prompts)]
    ps = [torch.randint(10, engine.vocab_size, (n,), generator=g).tolist() for n in lengths]
    best, flops = float("inf"), 0.0
    for _ in range(2):
        start = time.perf_counter()
        out = engine.generate(
            ps, [k] * prompts, Sampling(temperature=1.0, max_tokens=new_tokens, seed=0)
        )
        took = time.perf_counter() - start
        decoded = sum(len(c.token_ids) for per in out for c in per)
        if took < best:
            best, flops = took, generation_flops(engine.model_size, prompts, sum(lengths), decoded)
    return flops, best


def decode_matmul_rate(model: torch.nn.Module, rows: int, trials: int = 3) -> float:
    """FLOP/s of a decode step's matmuls alone: every nn.Linear of `model` (the output layer too),
    once each and in order, at `rows` rows in the weights' dtype, best of `trials`. A step reads
    every weight once for a few rows, so this, not matmul_rate's one 256-row product, bounds what
    generation can reach (attention, norms and sampling come on top). Through each layer's own
    forward, so on packed weights where the engine packs them (rollout_svc/engines/hf_packed.py)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {n: torch.randn(rows, n, dtype=model.dtype) for n in {m.in_features for m in linears}}
    flops = sum(2.0 * rows * m.in_features * m.out_features for m in linears)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(trials + 1):  # the first pass pays for allocation
            start = time.perf_counter()
            for m in linears:
                m(inputs[m.in_features])  # the engine's own layer: packed where it packs
            best = min(best, time.perf_counter() - start)
    return flops / best

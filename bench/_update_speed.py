"""The update's measures (sections of bench/real_speed.py): the samples it trains on (groups
that share a prompt; a mixed step as the learning run's are), the arrival-order packing that
length packing is held against, the FLOPs and seconds of one forward and backward, a 1024^3 bf16
matmul's rate, and the trainer service's own bf16 update (PoolOps) timed now and as it ran before
issue 55. real_speed.py prints and records what they return.
"""

from __future__ import annotations

import statistics
import time

import torch

from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample
from bench.cpu_shapes import rate as best_rate
from trainer_svc.logprobs import response_logprobs
from trainer_svc.packing import by_prompt, padded_size

SAMPLING = Sampling(temperature=1.0)


def grouped(groups: int, k: int, prompt: int, response: int, vocab: int) -> list[TrainSample]:
    """`groups` prompts of `prompt` tokens, `k` responses of `response` tokens each, in group
    order."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(groups):
        p = torch.randint(10, vocab, (prompt,), generator=g).tolist()
        for _ in range(k):
            r = torch.randint(10, vocab, (response,), generator=g).tolist()
            out.append(TrainSample("a", p, r, [0.0] * response, 1.0, SAMPLING))
    return out


def mixed_step(seed: int = 0) -> list[TrainSample]:
    """A step's samples as the learning run's are: 6 tool groups (128-token prompts, programs of
    30-90 tokens) and 6 reasoner groups (150-250-token prompts, answers of 8-40), K = 4, arriving
    interleaved."""
    g = torch.Generator().manual_seed(seed)

    def n(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    out = []
    for i in range(12):
        tool = i % 2 == 0
        prompt = [3 + i] * (128 if tool else n(150, 250))
        for _ in range(4):
            r = n(30, 90) if tool else n(8, 40)
            out.append(
                TrainSample(
                    "tool" if tool else "reasoner", prompt, [5] * r, [0.0] * r, 1.0, SAMPLING
                )
            )
    return out


def arrival_packing(samples: list[TrainSample], budget: int) -> list[list[int]]:
    """The baseline: whole groups in arrival order, a new micro-batch when the next row
    overflows."""
    out, cur = [], []
    for r in by_prompt(range(len(samples)), samples):
        if cur and padded_size([samples[i] for i in [*cur, r]], True) > budget:
            out.append(cur)
            cur = []
        cur.append(r)
    return out + [cur]


def update_pass(model, samples, share: bool) -> tuple[float, float]:
    """(FLOPs, seconds) of one forward and backward of the update's log-probs (its loss's work)."""
    from torch.utils.flop_counter import FlopCounterMode

    def once():
        model.zero_grad(set_to_none=True)
        lp, _, mask = response_logprobs(
            model, samples, "cpu", with_entropy=False, share_prompts=share
        )
        (lp * mask).sum().backward()

    with FlopCounterMode(display=False) as counter:
        once()
    flops = counter.get_total_flops()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - start)
    return flops, best


def square_bf16_rate(seconds: float = 0.3) -> float:
    """FLOP/s of a 1024^3 bf16 matmul in this process (bench/cpu_shapes.py's reference): the
    best of short trials over about `seconds`."""
    a, b = (torch.randn(1024, 1024, dtype=torch.bfloat16) for _ in range(2))
    return best_rate(lambda: a @ b, 2.0 * 1024**3, seconds) * 1e9


def service_update(path: str, reps: int) -> dict[str, float]:
    """The trainer's update as a `dtype: bfloat16` pool runs it (trainer_svc.ops.PoolOps, bf16
    autocast over float32 masters, 4096-token micro-batches) on a mixed step: seconds of each
    phase and FLOP/s (torch's FlopCounterMode over one update), against a 1024^3 bf16 matmul timed
    beside each update. Interleaved, `reps` times each, with the update as it ran before: autocast
    casting a norm's output once per projection (the norms' hooks off, loading.cast_norms_once)
    and AdamW's per-weight loop. Returns the medians."""
    from torch.utils.flop_counter import FlopCounterMode

    from atgrpo.contract.trainer import PoolSpec, UpdateConfig
    from trainer_svc.loading import cast_norms_once
    from trainer_svc.ops import PoolOps

    spec = PoolSpec(
        "bench", "p", path, ("tool", "reasoner"), dtype="bfloat16", micro_batch_tokens=4096
    )
    ops = PoolOps()
    state = ops.setup(spec)
    samples, cfg = mixed_step(), UpdateConfig(mini_batch_size=48)
    optimizers = {
        "now": state.optimizer,
        "before": torch.optim.AdamW(
            state.params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay
        ),
    }

    def run(variant: str) -> dict[str, float]:
        for hook in state.norm_hooks:
            hook.remove()
        state.norm_hooks = cast_norms_once(state.model) if variant == "now" else []
        state.optimizer = optimizers[variant]
        start = time.perf_counter()
        m = ops.train(samples, cfg)
        return {"update_s": time.perf_counter() - start} | m

    for variant in optimizers:  # AdamW allocates its moments in its first step
        run(variant)
    with FlopCounterMode(display=False) as counter:
        run("now")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in optimizers}
    square = []
    for _ in range(reps):
        for variant in optimizers:
            square.append(square_bf16_rate())
            runs[variant].append(run(variant))
    out = {"flops": float(counter.get_total_flops()), "square_bf16": statistics.median(square)}
    for variant, ms in runs.items():
        for key in ("update_s", "time_forward_s", "time_backward_s", "time_optimizer_s"):
            out[f"{variant}_{key}"] = statistics.median(m[key] for m in ms)
        out[f"{variant}_mfu"] = statistics.median(
            m["update_flops"]
            / (m["time_forward_s"] + m["time_backward_s"] + m["time_optimizer_s"])
            / ops.matmul_rate
            for m in ms
        )
    return out

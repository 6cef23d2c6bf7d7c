"""What the GPU check's parts (gpu_check.py) share, in one place: the random model of the checked
size, the example's first pool and its sampling, PoolOps set up as the trainer service sets a pool
up, the trainer's log-probs of given samples, a full-weight push into a replica over loopback
gRPC, and the host and device memory readings the parts report. gpu_check_parts.py and
gpu_check_two_gpu.py take these as `g`.

Everything beyond the standard library is imported inside the function that needs it: a part runs
on a bare GPU machine with only the wheels it lists (gpu_check_wheels.NEEDS).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# A small model with Qwen3's layout, for the CPU smoke run: same code path, seconds instead of
# minutes.
SMALL = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
}


# The CUDA allocator setting the trainer service runs with (trainer_svc/__main__.py): gpu_check's
# run_part sets it for the parts that run the trainer, and check_trainer reports it.
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def model_config(size: str) -> dict:
    base = json.loads((ROOT / "atgrpo/models/configs/Qwen3-1.7B/config.json").read_text())
    return {**base, **SMALL} if size == "small" else base


def build_random_model(cfg: dict, out: Path, dtype: str) -> Path:
    """Random weights (fixed seed) in the given architecture, saved as a local model folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    return out


def samples_for(tokens: int, n: int, vocab: int, prompt_share: float = 0.5):
    """`n` samples of `tokens` tokens each (prompt + response), random ids, nonzero advantages."""
    import random

    from atgrpo.contract.sampling import Sampling
    from atgrpo.contract.trainer import TrainSample

    rng = random.Random(0)
    p = max(1, int(tokens * prompt_share))
    r = max(1, tokens - p)
    return [
        TrainSample(
            "a",
            [rng.randrange(3, vocab) for _ in range(p)],
            [rng.randrange(3, vocab) for _ in range(r)],
            [-7.0] * r,
            rng.choice([-1.0, 1.0]),
            Sampling(temperature=1.0),
        )
        for _ in range(n)
    ]


def _peak(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    with open("/proc/self/status") as f:  # CPU: the high-water mark of this process
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def _reserved(device: str) -> int:
    import torch

    return torch.cuda.max_memory_reserved() if device.startswith("cuda") else 0


def example_pool(args):
    """The example's config and its first pool, on this check's device and micro-batch size."""
    from atgrpo.config import load_config

    run = load_config(args.example)
    name, pool = next(iter(run.pools.items()))
    tokens = args.micro_batch_tokens or pool.micro_batch_tokens
    return (
        run,
        name,
        dataclasses.replace(
            pool, device=args.device, micro_batch_tokens=tokens, dtype=args.dtype or pool.dtype
        ),
    )


def example_sampling(run, pool_name: str, max_tokens: int):
    """The train sampling (temperature, top-k, top-p) of the example's first agent on the pool."""
    agent = next(a for a, c in run.agents.items() if c.pool == pool_name)
    return dataclasses.replace(run.agents[agent].train_sampling, max_tokens=max_tokens)


def random_model(args, work: Path, dtype: str) -> Path:
    """The random model, built by the first part that needs it; the later parts (processes of
    their own, one work folder) load it again."""
    path = work / "model"
    return (
        path
        if (path / "config.json").exists()
        else build_random_model(model_config(args.size), path, dtype)
    )


def setup_pool(args, path: Path, name: str, pool):
    """PoolOps set up as the trainer service sets a pool up (its dtype, checkpointing, lr)."""
    from atgrpo.contract.trainer import PoolSpec
    from trainer_svc.ops import PoolOps

    spec = PoolSpec(
        "gpu-check",
        name,
        str(path),
        ("a",),
        lr=pool.optim.lr,
        device=args.device,
        dtype=pool.dtype,
        micro_batch_tokens=pool.micro_batch_tokens,
        gradient_checkpointing=pool.gradient_checkpointing,
    )
    ops = PoolOps()
    ops.setup(spec)
    return ops


def score(ops, run, name: str, samples) -> list:
    """The trainer's log-probs of `samples`, as its update's first forward computes them."""
    from trainer_svc.update import proximal_logprobs
    from trainer_svc.update_context import UpdateContext

    state = ops.state
    return proximal_logprobs(
        UpdateContext(
            state.model, samples, run.update_for(name), state.update_settings, str(state.device)
        )
    )


def model_state(path: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


def push_state(engine, state: dict, version: int = 1) -> dict:
    """A full-weight push of `state` over loopback gRPC into a replica serving `engine`."""
    import asyncio

    from atgrpo.rpc.server import create_server
    from rollout_svc.client import push_weights
    from rollout_svc.pool import PoolRuntime
    from rollout_svc.replica import Replica
    from rollout_svc.server import bindings

    async def push() -> tuple[float, int]:
        running = await create_server(bindings(Replica({"p": PoolRuntime("p", engine)}), None))
        try:
            t0 = time.monotonic()
            sent = await push_weights(
                [f"127.0.0.1:{running.port}"], [("", state, None)], "p", version
            )
            return time.monotonic() - t0, sent
        finally:
            await running.stop(0)

    seconds, sent = asyncio.run(push())
    return {"bytes_sent": sent, "push_s": seconds, "push_gb_per_s": round(sent / seconds / 1e9, 3)}


def push_into(engine, path: Path) -> dict:
    """push_state of the model folder's own weights (a reload: the same weights, a new version)."""
    return push_state(engine, model_state(path))

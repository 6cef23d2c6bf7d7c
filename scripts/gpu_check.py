"""The prepared GPU check (issue 19): one run, at most ~8 minutes on one GPU, that writes a JSON report.

1. The trainer at a real size: a randomly initialised model of Qwen3-1.7B's configuration (the
   architecture config the repository carries; nothing is downloaded) is saved locally, loaded
   by the trainer's own code (PoolOps: float32 masters under bf16 autocast, gradient
   checkpointing as the pool says) and updated at the example's settings (its dtype,
   micro_batch_tokens, mini_batch_size, lr). It reports the update's tokens/s and the peak device
   memory, against `atgrpo plan`'s estimate for the same pool.
2. The services: 3 steps of the toy L1 loop (tiny model, hf engine) with the rollout and the
   trainer on the device, through all five services (`python -m atgrpo.cli train`).
3. Weight sync (issue 20): the same random model served by an hf-engine replica on the device, a
   full-weight push into it over loopback gRPC (GB/s, peak host and device memory), and the
   engine's generation tokens/s there.

    python scripts/gpu_check.py                                   # on a GPU machine
    python scripts/gpu_check.py --device cpu --size small --out /tmp/check.json   # smoke (make test)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A small model with Qwen3's layout, for the CPU smoke run: same code path, seconds instead of minutes.
SMALL = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096}


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
    return [TrainSample("a", [rng.randrange(3, vocab) for _ in range(p)], [rng.randrange(3, vocab) for _ in range(r)],
                        [-7.0] * r, rng.choice([-1.0, 1.0]), Sampling(temperature=1.0)) for _ in range(n)]


def _peak(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    with open("/proc/self/status") as f:   # CPU: the high-water mark of this process
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


def check_trainer(args, work: Path) -> dict:
    """Tokens/s and peak memory of one update at the example's pool settings, with the plan's estimate."""
    import torch

    from atgrpo.config import load_config
    from atgrpo.contract.trainer import PoolSpec
    from atgrpo.plan import trainer_components
    from trainer_svc.trainer import PoolOps

    run = load_config(args.example)
    name, pool = next(iter(run.pools.items()))
    cfg = model_config(args.size)
    tokens = args.micro_batch_tokens or pool.micro_batch_tokens
    pool = dataclasses.replace(pool, device=args.device, micro_batch_tokens=tokens)
    started = time.monotonic()
    # On CPU the peak is the process's: what the trainer holds is the rise over this.
    baseline = 0 if args.device.startswith("cuda") else _rss()
    path = build_random_model(cfg, work / "model", "bfloat16" if pool.dtype == "bfloat16" else "float32")
    spec = PoolSpec("gpu-check", name, str(path), ("a",), lr=pool.optim.lr, device=args.device, dtype=pool.dtype,
                    micro_batch_tokens=tokens, gradient_checkpointing=pool.gradient_checkpointing)
    ops = PoolOps()
    state = ops.setup(spec)
    loaded_s = time.monotonic() - started
    per_sample = min(args.sample_tokens, tokens)
    samples = samples_for(per_sample, max(1, tokens // per_sample), cfg["vocab_size"])
    update = dataclasses.replace(run.algorithm.to_update(), mini_batch_size=len(samples), micro_batch_tokens=tokens,
                                 autocast_bf16=state.mixed_bf16)
    ops.train(samples, update)                     # warm-up: allocator, AdamW state, kernels
    _reset_peak(args.device)
    t0 = time.monotonic()
    metrics = ops.train(samples, update)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.monotonic() - t0
    measured = _peak(args.device) - baseline
    estimate = trainer_components(_shape(cfg), pool, run.algorithm, args.device, tokens=tokens)
    return {
        "model": "Qwen3-1.7B (random weights)" if args.size == "1.7b" else "Qwen3-shaped small (random weights)",
        "pool": name, "dtype": pool.dtype, "micro_batch_tokens": tokens, "samples": len(samples),
        "sample_tokens": per_sample, "checkpointing": state.checkpointing, "load_s": round(loaded_s, 1),
        "update_s": round(seconds, 2),
        "tokens_per_s": round(sum(len(s.response_ids) for s in samples) / seconds, 1),
        "peak_bytes": measured,
        "plan_bytes": sum(estimate.values()), "plan_components": estimate,
        "plan_ratio": round(measured / max(1, sum(estimate.values())), 3),
        "loss": metrics.get("loss"),
    }


def _shape(cfg: dict):
    from atgrpo.plan import ModelShape

    return ModelShape.from_config(cfg)


def check_services(args, work: Path) -> dict:
    """3 steps of the toy L1 loop through the five services, rollout (hf engine) and trainer on the device."""
    import yaml

    from atgrpo.models import build_tiny_model

    model = build_tiny_model(work / "tiny")
    run_dir = work / "toy-run"
    config = {
        "run": {"name": "gpu-check-toy", "seed": 0, "steps": args.loop_steps, "tasks_per_step": 8,
                "eval_every_steps": 0, "eval_tasks": 8, "checkpoint_every_steps": 0, "run_dir": str(run_dir)},
        "env": {"name": "toy", "turn_order": ["speaker", "listener"], "max_turns": 2},
        "pools": {"shared": {"model_path": str(model), "engine": "hf", "device": args.device, "dtype": "float32",
                             "optim": {"lr": 5e-4, "warmup_steps": 0}}},
        "agents": {a: {"pool": "shared", "train_sampling": {"temperature": 1.0, "max_tokens": 4},
                       "eval_sampling": {"max_tokens": 4}} for a in ("speaker", "listener")},
        "algorithm": {"k": 4, "mini_batch_size": 64},
    }
    path = work / "toy.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "atgrpo.cli", "train", str(path)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=args.loop_timeout_s)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if (run_dir / "metrics.jsonl").exists() else []
    steps = [e for e in lines if e.get("kind") == "step"]
    return {"exit_code": out.returncode, "seconds": round(time.monotonic() - t0, 1), "steps": len(steps),
            "staleness_max": [max((p.get("staleness_max", 0) for p in e.get("pools", {}).values()), default=0)
                              for e in steps],
            "stderr_tail": out.stderr[-2000:] if out.returncode else ""}


def check_push(args, work: Path) -> dict:
    """A full-weight push of the model into an hf-engine replica on the device, and its tokens/s."""
    import asyncio

    import torch
    from safetensors.torch import load_file

    from atgrpo.contract.sampling import Sampling
    from atgrpo.rpc.server import create_server
    from rollout_svc.client import push_weights
    from rollout_svc.engines.hf import HFEngine
    from rollout_svc.pool import PoolRuntime
    from rollout_svc.replica import Replica
    from rollout_svc.server import bindings

    path = work / "model"
    if not (path / "config.json").exists():
        path = build_random_model(model_config(args.size), path, "bfloat16")
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    engine = HFEngine(str(path), device=args.device, dtype=dtype)
    state = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}
    size = sum(v.numel() * v.element_size() for v in state.values())

    async def push() -> tuple[float, int]:
        running = await create_server(bindings(Replica({"p": PoolRuntime("p", engine)}), None))
        try:
            t0 = time.monotonic()
            sent = await push_weights([f"127.0.0.1:{running.port}"], [("", state, None)], "p", 1)
            return time.monotonic() - t0, sent
        finally:
            await running.stop(0)

    host = _rss()
    _reset_peak(args.device)
    if not args.device.startswith("cuda"):
        host = _rss()
    seconds, sent = asyncio.run(push())
    device_peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0
    host_peak = _peak("cpu") - host
    sampling = Sampling(temperature=1.0, max_tokens=args.gen_tokens)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(128)] for i in range(8)]
    engine.generate(prompts[:1], [1], Sampling(temperature=1.0, max_tokens=4))       # warm-up
    t0 = time.monotonic()
    outs = engine.generate(prompts, [1] * len(prompts), sampling)
    gen_s = time.monotonic() - t0
    tokens = sum(len(c.token_ids) for out in outs for c in out)
    return {"model_bytes": size, "bytes_sent": sent, "push_s": round(seconds, 2),
            "push_gb_per_s": round(sent / seconds / 1e9, 3), "host_peak_growth_bytes": host_peak,
            "host_peak_over_model": round(host_peak / size, 2), "device_peak_bytes": device_peak,
            "generate_tokens_per_s": round(tokens / gen_s, 1), "generate_batch": len(prompts)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=("1.7b", "small"), default="1.7b")
    ap.add_argument("--example", default=str(ROOT / "examples/code_L1_gpu.yaml"),
                    help="the config whose first pool's settings the update uses")
    ap.add_argument("--micro-batch-tokens", type=int, default=0, help="override the example's (0: keep it)")
    ap.add_argument("--sample-tokens", type=int, default=2048, help="prompt + response tokens of each sample")
    ap.add_argument("--loop-steps", type=int, default=3)
    ap.add_argument("--loop-timeout-s", type=int, default=300)
    ap.add_argument("--gen-tokens", type=int, default=64, help="tokens per sequence of the generation check")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args(argv)
    report: dict = {"device": args.device, "size": args.size}
    try:
        import torch
        report["torch"] = torch.__version__
        if args.device.startswith("cuda"):
            report["gpu"] = torch.cuda.get_device_name(0)
    except Exception as err:  # noqa: BLE001 - reported, not raised: the report is the product
        report["error"] = f"torch: {err}"
    with tempfile.TemporaryDirectory(prefix="atgrpo-gpu-check-") as tmp:
        for part, fn in (("trainer", check_trainer), ("services", check_services), ("push", check_push)):
            try:
                report[part] = fn(args, Path(tmp))
            except Exception as err:  # noqa: BLE001 - one part failing must not lose the other's figures
                report[part] = {"error": f"{type(err).__name__}: {err}"}
            Path(args.out).write_text(json.dumps(report, indent=2))   # after each part: a timeout keeps what ran
    print(json.dumps(report, indent=2))
    ok = "error" not in report["trainer"] and report["services"].get("exit_code") == 0 \
        and report["services"].get("steps") == args.loop_steps and "error" not in report["push"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

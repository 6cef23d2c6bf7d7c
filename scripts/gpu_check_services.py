"""Parts 3 and 4 of the GPU check (gpu_check.py's docstring says what each measures), the two that
go through the services' gRPC: the toy loop through all five services, and a full-weight push into
an hf-engine replica, beside the same bytes over a plain gRPC stream.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import gpu_check_parts as parts
from gpu_check_fixtures import (
    ROOT,
    _peak,
    _reserved,
    _reset_peak,
    _rss,
    example_pool,
    example_sampling,
    model_state,
    push_state,
    random_model,
)


def check_services(args, work: Path) -> dict:
    """3 steps of the toy L1 loop through the five services, rollout (hf engine) and trainer on the
    device."""
    import yaml

    from atgrpo.models import build_tiny_model

    model = build_tiny_model(work / "tiny")
    run_dir = work / "toy-run"
    config = {
        "run": {
            "name": "gpu-check-toy",
            "seed": 0,
            "steps": args.loop_steps,
            "tasks_per_step": 8,
            "eval_every_steps": 0,
            "eval_tasks": 8,
            "checkpoint_every_steps": 0,
            "run_dir": str(run_dir),
        },
        "env": {"name": "toy", "turn_order": ["speaker", "listener"], "max_turns": 2},
        "pools": {
            "shared": {
                "model_path": str(model),
                "engine": "hf",
                "device": args.device,
                "dtype": "float32",
                "optim": {"lr": 5e-4, "warmup_steps": 0},
            }
        },
        "agents": {
            a: {
                "pool": "shared",
                "train_sampling": {"temperature": 1.0, "max_tokens": 4},
                "eval_sampling": {"max_tokens": 4},
            }
            for a in ("speaker", "listener")
        },
        "algorithm": {"k": 4, "mini_batch_size": 64},
    }
    path = work / "toy.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "atgrpo.cli", "train", str(path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=args.loop_timeout_s,
    )
    lines = (
        [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if (run_dir / "metrics.jsonl").exists()
        else []
    )
    steps = [e for e in lines if e.get("kind") == "step"]
    return {
        "exit_code": out.returncode,
        "seconds": round(time.monotonic() - t0, 1),
        "steps": len(steps),
        # the largest of the services' processes (this part's own host peak is the launcher's)
        "services_host_peak_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
        "staleness_max": [
            max((p.get("staleness_max", 0) for p in e.get("pools", {}).values()), default=0)
            for e in steps
        ],
        "stderr_tail": out.stderr[-2000:] if out.returncode else "",
    }


def check_push(args, work: Path) -> dict:
    """A full-weight push of the model into an hf-engine replica on the device, and its tokens/s."""
    import torch

    from atgrpo.contract.sampling import Sampling
    from atgrpo.contract.weight_payload import CHUNK_BYTES
    from rollout_svc.engines.hf import HFEngine

    path = random_model(args, work, "bfloat16")
    run, name, _ = example_pool(args)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    engine = HFEngine(str(path), device=args.device, dtype=dtype)
    state = model_state(path)
    size = sum(v.numel() * v.element_size() for v in state.values())
    host = _rss()
    _reset_peak(args.device)
    if not args.device.startswith("cuda"):
        host = _rss()
    pushed = push_state(engine, state)
    seconds, sent = pushed["push_s"], pushed["bytes_sent"]
    device_peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0
    device_reserved = _reserved(args.device)
    host_peak = _peak("cpu") - host
    sampling = example_sampling(run, name, args.gen_tokens)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(128)] for i in range(8)]
    engine.generate(prompts[:1], [1], Sampling(temperature=1.0, max_tokens=4))  # warm-up
    t0 = time.monotonic()
    outs = engine.generate(prompts, [1] * len(prompts), sampling)
    gen_s = time.monotonic() - t0
    tokens = sum(len(c.token_ids) for out in outs for c in out)
    # the same tensors (in the engine's dtype, as the push sent them) over a plain gRPC stream
    raw = parts.raw_grpc_push({k: v.to(engine.weight_dtype) for k, v in state.items()}, CHUNK_BYTES)
    return {
        "model_bytes": size,
        "bytes_sent": sent,
        "push_s": round(seconds, 2),
        "push_gb_per_s": round(sent / seconds / 1e9, 3),
        **raw,
        # the push's rate as a share of the plain stream's: what the push costs over gRPC alone
        "push_over_raw_grpc": round(
            sent / seconds / (raw["raw_grpc_bytes"] / raw["raw_grpc_s"]), 3
        ),
        "host_peak_growth_bytes": host_peak,
        "host_peak_over_model": round(host_peak / size, 2),
        "device_peak_bytes": device_peak,
        "device_reserved_bytes": device_reserved,
        "sampling": dataclasses.asdict(sampling),
        "generate_tokens_per_s": round(tokens / gen_s, 1),
        "generate_batch": len(prompts),
    }

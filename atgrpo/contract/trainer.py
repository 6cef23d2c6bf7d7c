"""What the router and a trainer exchange: a pool's setup, a step's samples, how to update, and
the result. Plain types; atgrpo.contract.trainer_wire converts them to and from protobuf."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from atgrpo.contract.fields import FLAT
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.service import ServiceInfo


@dataclass(frozen=True)
class TrainSample:
    """One sample as a trainer takes it: the ids, the sampling distribution's log-probs, the
    advantage."""

    agent: str
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    old_logprobs: Sequence[float]  # under `sampling`, from the rollout engine
    advantage: float
    sampling: Sampling = field(default_factory=Sampling)
    # The version of the weights that sampled it; None: not pinned (taken as the current weights).
    policy_version: int | None = None


@dataclass(frozen=True)
class LossConfig:
    """The policy loss's settings (atgrpo.algo.loss.policy_loss; DESIGN.md §1). This is their one
    form: the run config's algorithm section holds it (its keys are written there, flat), the
    router sends it (UpdateParams, atgrpo.contract.trainer_wire) and the loss reads it."""

    clip_eps_low: float = 0.2
    """PPO ratio clip below: 1 - eps_low"""
    clip_eps_high: float = 0.2
    """PPO ratio clip above: 1 + eps_high"""
    dual_clip_c: float = 3.0
    """dual-clip bound on negative-advantage tokens (> 1): their loss is at most c * |A|"""
    kl_coef: float = 0.0
    """weight of the k3 KL to the frozen reference (a LoRA pool's base; a full pool's initial
    weights, a second copy in memory); 0 = no reference model"""
    entropy_coef: float = 0.0
    """entropy bonus weight"""
    behav_imp_cap: float = 2.0
    """the cap on each token's truncated importance weight from the rollout engine's log-probs to
    the trainer's, min(exp(trainer - engine), cap) (atgrpo.algo.mismatch). With it on, the PPO
    ratio's old log-probs are the trainer's own, scored at the start of each update (its
    behaviour log-probs; with max_staleness > 0 its proximal ones), and the engine's enter only
    through this weight. 2 leaves the usual engine/trainer mismatch (ratios about 0.75 to 1.35)
    uncut and truncates only the tail, where one token would otherwise dominate the batch; 1
    truncates as V-trace does (Espeholt et al. 2018), AReaL uses 5; docs/design.md gives the
    reasons. Exactly 0 turns the correction off: the ratio sits on the engine's log-probs (the
    behaviour before issue 59), allowed only with max_staleness 0. A registered loss without
    proximal=True never gets the trainer's log-probs, so the cap does not apply to it"""
    policy_loss: str = "ppo_clip"
    """the policy loss, by its registered name (atgrpo.algo.registry). ppo_clip: the clipped
    surrogate with dual clip; with behav_imp_cap > 0 or max_staleness > 0 it trains with its
    decoupled form (`decoupled`), as a loss registered with proximal=True does itself"""


@dataclass(frozen=True)
class UpdateConfig:
    """How a pool updates on a step's samples: the router's settings, sent with every Train call.
    The run config's algorithm section holds this type (its keys written there, flat) and
    RunConfig.update_for gives a pool's. The trainer's own settings (micro-batch budget, gradient
    clip, precision) come from its pool's setup, not from here."""

    loss: LossConfig = field(default_factory=LossConfig, metadata=FLAT)
    """the policy loss's settings"""
    epochs: int = 1
    """passes over each step's samples"""
    mini_batch_size: int = 16
    """samples (sequences) per optimizer step; on a LoRA pool, per agent (each adapter steps on its
    own)"""
    max_staleness: int = 0
    """asynchronous training: a sample drawn by version v is trained at version u only if
    u - v <= max_staleness (older ones are dropped and their task collected again), and collection
    runs ahead while the pools train; > 0 trains with the decoupled loss. 0 = the synchronous
    on-policy loop. A pool may set its own (pools.<p>.max_staleness; RunConfig.max_staleness)"""

    @property
    def trainer_logprobs(self) -> bool:
        """Whether the trainer scores the samples itself at the start of the update, for the
        ratio's old log-probs: with the behaviour correction on (behav_imp_cap > 0) or samples
        that may be stale (max_staleness > 0)."""
        return self.loss.behav_imp_cap > 0 or self.max_staleness > 0

    @property
    def policy_loss(self) -> str:
        """The registered loss the update trains with: ppo_clip turns into its decoupled form when
        the trainer scores its own log-probs (trainer_logprobs), the ratio sitting on them."""
        name = self.loss.policy_loss
        return "decoupled" if name == "ppo_clip" and self.trainer_logprobs else name


# The update settings' bounds, one table: the run config's check (algorithm.*; atgrpo.config_rules)
# and the trainer that receives them (trainer_svc.server) both apply it, so a value the config
# accepts is one the trainer takes. field -> (ok, what it must be, how to fix it).
Bound = tuple[Callable[[float], bool], str, str]
MAX_EPOCHS = 1000
_UNIT = (lambda v: 0 < v < 1, "in (0, 1)", "The usual value is 0.2")
_OFF = (lambda v: v >= 0, ">= 0", "Use 0 to turn it off")
UPDATE_BOUNDS: dict[str, Bound] = {
    "clip_eps_low": _UNIT,
    "clip_eps_high": _UNIT,
    "dual_clip_c": (lambda v: v > 1, "> 1", "The usual value is 3.0"),
    "kl_coef": _OFF,
    "entropy_coef": _OFF,
    "behav_imp_cap": (
        lambda v: v == 0 or v >= 1,
        "0 (the correction off) or >= 1",
        "The usual values are 1 (V-trace) to 5 (AReaL), 2 by default; 0 turns the correction off",
    ),
    "epochs": (
        lambda v: 1 <= v <= MAX_EPOCHS,
        f"between 1 and {MAX_EPOCHS}",
        "Set it to 1 or more",
    ),
    "mini_batch_size": (lambda v: v >= 1, "at least 1", "Set it to 1 or more"),
    "max_staleness": (lambda v: v >= 0, ">= 0", "Use 0 for on-policy training"),
}


def update_problems(u: UpdateConfig) -> list[str]:
    """Each of `u`'s settings out of UPDATE_BOUNDS, as "name value must be ..."; NaN is out of every
    bound."""
    values = {
        **{k: getattr(u.loss, k) for k in UPDATE_BOUNDS if hasattr(u.loss, k)},
        **{k: getattr(u, k) for k in UPDATE_BOUNDS if hasattr(u, k)},
    }
    out = [
        f"{k} {v} must be {UPDATE_BOUNDS[k][1]}"
        for k, v in values.items()
        if not (math.isfinite(v) and UPDATE_BOUNDS[k][0](v))
    ]
    if u.loss.behav_imp_cap == 0 and u.max_staleness > 0:
        out.append(CAP_OFF_STALE.format(staleness=u.max_staleness))
    return out


# Stale samples need the trainer's proximal log-probs and the importance weight from the engine's:
# without a cap that weight is unbounded, and without the weight the loss ignores the staleness.
CAP_OFF_STALE = (
    "behav_imp_cap 0 (the correction off) needs max_staleness 0, not {staleness}: stale samples "
    "train with the decoupled loss, whose importance weight needs a cap; set behav_imp_cap to "
    "1 or more (2 is the default) or max_staleness to 0"
)


@dataclass(frozen=True)
class PoolSpec:
    """A pool's setup for a run: the model and how it trains, where its new weights go (its rollout
    replicas) and where checkpoints go."""

    run_id: str
    pool: str
    model_path: str
    agents: tuple[str, ...]
    specialization: str = "full"  # "full" or "lora"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 10
    total_steps: int = 100
    min_lr_ratio: float = 0.3
    grad_clip: float = 1.0
    device: str = "cpu"
    dtype: str = "auto"  # auto: bf16 mixed precision where the device supports it, else float32
    seed: int = 0
    checkpoint_dir: str = ""
    checkpoint_every_updates: int = 0
    rollout_addresses: tuple[str, ...] = field(default=())
    # the token budget of one forward/backward; 0 = the trainer's default
    micro_batch_tokens: int = 0
    gradient_checkpointing: bool | None = None  # None: on where the trainer runs on cuda


# The update's rollout/training mismatch figures (atgrpo.algo.mismatch.mismatch_metrics): in
# TrainResult.metrics, TrainResponse.mismatch and the step record's pools.<p>.mismatch.
MISMATCH_KEYS = (
    "mismatch_kl",
    "mismatch_outside_support",
    "mismatch_ratio_p05",
    "mismatch_ratio_p50",
    "mismatch_ratio_p95",
    "mismatch_capped_fraction",
)


@dataclass
class TrainResult:
    """A pool's update of one step: its new version and the update's figures (loss, clip_fraction,
    approx_kl, entropy, grad_norm, kl_ref, staleness_max, staleness_mean, masked_tokens, tokens,
    samples, train_seconds, push_seconds, push_bytes; when the trainer scores its own log-probs
    (behav_imp_cap > 0 or max_staleness > 0) the mismatch figures MISMATCH_KEYS, which the wire
    carries, and the decoupled loss's behav_approx_kl, behav_imp_weight_mean,
    behav_imp_weight_max, behav_capped_fraction, which stay on the trainer; and where the
    update's time went: time_forward_s, time_backward_s, time_optimizer_s, update_tokens,
    update_flops and the trainer's matmul_flops_per_s, atgrpo.perf), and per trained agent its
    samples, tokens and (LoRA pools, whose adapters clip on their own) grad_norm."""

    run_id: str
    step: int
    version: int
    metrics: dict[str, float]
    agents: dict[str, dict[str, float]] = field(default_factory=dict)
    replayed: bool = False


@dataclass(frozen=True)
class SavedCheckpoint:
    path: str  # the folder, on the trainer's machine
    version: int  # the pool's version saved there


@dataclass(frozen=True)
class TrainerInfo:
    """What a trainer holds: its pool, the run it serves and the version of its weights."""

    pool: str
    run_id: str = ""
    version: int = 0
    agents: tuple[str, ...] = ()
    specialization: str = ""
    device: str = ""
    rollout_addresses: tuple[str, ...] = ()
    service: ServiceInfo = field(default_factory=lambda: ServiceInfo("trainer"))
    checkpoint_bytes: int = 0  # about what one SaveCheckpoint writes

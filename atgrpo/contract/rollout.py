"""What the rollout service exchanges: collection plans, generations, samples and episode ends,
weight loads, and what a replica serves. Protobuf lives in atgrpo.contract.rollout_wire."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from atgrpo.contract.sampling import Sampling
from atgrpo.contract.service import ServiceInfo


@dataclass(frozen=True)
class PolicyRef:
    pool: str
    adapter: str = ""  # "" = the pool's full model
    version: int = 0


@dataclass(frozen=True)
class AgentPlan:
    """One agent's part in a collection: where it samples from and how."""

    name: str
    pool: str
    adapter: str = ""
    sampling: Sampling = field(default_factory=Sampling)
    system_prompt: str = ""


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # one per token, under the sampling transform
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"


@dataclass
class Generation:
    prompt_ids: list[int]
    completions: list[Completion]
    policy: PolicyRef
    prompt_truncated: bool = False
    # This generation's share of the engine batches that made it (rollout_svc.pool): prefill_s,
    # decode_s, prefill_tokens, decode_tokens, gen_flops (model FLOPs, atgrpo.perf) and
    # gen_matmul_flops (what the replica's measured matmul rate does in the same seconds). Empty
    # from an engine or replica that does not say.
    timing: dict[str, float] = field(default_factory=dict)
    prompt_text: str = ""  # prompt_ids decoded, special tokens included; "" from an engine without


@dataclass(frozen=True)
class TaskRef:
    task_id: str
    seed: int
    split: str = "train"
    # which run of the task within its Collect (1, 2, ...): the plan numbers every task, and the
    # rollout service refuses a plan that does not
    episode: int = 0


@dataclass(frozen=True)
class CollectPlan:
    env: str
    tasks: tuple[TaskRef, ...]
    agents: dict[str, AgentPlan]
    turn_order: tuple[str, ...]
    max_turns: int
    k: int = 8
    # trajectory: K independent flat episodes per task
    mode: Literal["tree", "flat", "trajectory"] = "tree"
    selection: Literal["best", "first"] = "best"
    parallel: bool = False  # agents of a turn all see the turn's starting state
    # parallel turns: paired (branch k of each agent is one joint action) or all_pairs (each
    # answer is scored against every answer of its partners; rollout_svc.tree)
    parallel_credit: Literal["paired", "all_pairs"] = "paired"
    alpha: float = 1.0
    env_options: dict[str, Any] = field(default_factory=dict)
    max_concurrent_tasks: int = 8
    pool_addresses: dict[str, str] = field(default_factory=dict)  # pools served by other replicas
    # The weights the samples must come from: a replica serving another version of any of them
    # answers FAILED_PRECONDITION before it starts (and the router brings it up to date).
    expected_versions: tuple[PolicyRef, ...] = ()
    run_id: str = ""
    step: int = 0


@dataclass
class Sample:
    task_id: str
    agent: str
    turn: int
    branch: int
    policy: PolicyRef
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    team_reward: float
    local_reward: float
    done: bool
    success: bool
    selected: bool
    sampling: Sampling
    prompt_truncated: bool = False
    response_truncated: bool = False
    finish_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    response_text: str = ""  # what the env was given; the ids are what training uses
    episode: int = 0  # its TaskRef's episode: (task_id, episode) names its tree
    prompt_text: str = ""  # prompt_ids decoded: what the agent saw (inspection; training uses ids)


@dataclass(frozen=True)
class RolloutInfo:
    """A replica: its engine and device, and every pool and adapter it serves with their
    versions."""

    engine: str
    device: str
    policies: tuple[PolicyRef, ...]
    service: ServiceInfo = field(default_factory=lambda: ServiceInfo("rollout"))
    # pool -> "bfloat16": what pushes are cast to
    weight_dtypes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightsLoaded:
    """A replica's answer to a weight push: what it serves now, how much arrived, how long loading
    took."""

    policy: PolicyRef
    bytes_received: int
    load_ms: int


@dataclass
class EpisodeEnd:
    task_id: str
    success: bool
    turns: int
    agent_rewards: dict[str, float]
    error: str = ""
    # Set on the last EpisodeEnd of a Collect only: where that Collect's time went
    # (rollout_svc.tree): collect_s (its wall time), env_s (env RPCs in flight while no generation
    # was), and the sums of its generations' timing (Generation.timing). Empty on the others, and
    # from older replicas.
    timing: dict[str, float] = field(default_factory=dict)

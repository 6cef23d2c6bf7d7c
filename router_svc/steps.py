"""The router's per-step logic as plain functions: which tasks a step collects, and how a step's
samples become each pool's training batch (DESIGN.md §1-2). No gRPC here."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from atgrpo.algo.registry import adv_estimator, estimate
from atgrpo.config import RunConfig
from atgrpo.contract.env import seed_for
from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, PolicyRef, Sample, TaskRef
from atgrpo.contract.trainer import TrainSample
from atgrpo.env_check import env_options

# Runs with different seeds draw from disjoint stretches of the generated tasks.
_RUN_STRIDE = 10_000_000


def step_tasks(
    run_seed: int,
    step: int,
    count: int,
    split: str = "train",
    task_ids: Sequence[str] | None = None,
) -> list[TaskRef]:
    """The tasks of `step` (0-based): a pure function of (seed, step), so a resumed run collects
    exactly the tasks an uninterrupted one would.

    Generated tasks (task_ids None) are taken in order, each once; a finite task list is walked in
    a fresh seeded permutation per epoch.
    """
    if task_ids is None:
        first = run_seed * _RUN_STRIDE + step * count
        return [
            TaskRef(f"{split}-{i}", seed_for(split, i), split) for i in range(first, first + count)
        ]
    if not task_ids:
        raise ValueError(f"the {split} split has no tasks")
    out = []
    for k in range(step * count, (step + 1) * count):
        epoch, pos = divmod(k, len(task_ids))
        order = list(range(len(task_ids)))
        random.Random(f"{run_seed}:{split}:{epoch}").shuffle(order)
        out.append(TaskRef(task_ids[order[pos]], order[pos], split))
    return out


@dataclass
class AgentStats:
    samples: int = 0
    groups: int = 0
    zero_variance_groups: int = 0
    reward_sum: float = 0.0
    advantages: list[float] = field(default_factory=list)
    prompts_cut: int = 0  # prompts over max_prompt_tokens, kept by their end
    responses_cut: int = 0  # responses that hit max_tokens


@dataclass
class StepBatches:
    per_pool: dict[str, list[TrainSample]]
    agents: dict[str, AgentStats]
    dropped: int  # samples filtered out (zero-variance groups)
    rewards: list[float] = field(default_factory=list)  # per input sample: alpha*team + local
    advantages: list[float] = field(default_factory=list)  # per input sample (filtered ones too)


def batches_for(cfg: RunConfig, samples: Sequence[Sample]) -> StepBatches:
    """step_batches with the run's agent-to-pool map and algorithm settings."""
    alg = cfg.algorithm
    return step_batches(
        samples,
        cfg.pool_of,
        alpha=alg.alpha,
        norm_std=alg.norm_std,
        filter_zero_variance=alg.filter == "zero_variance",
        grouping=alg.grouping,
    )


def step_batches(
    samples: Sequence[Sample],
    pool_of: Mapping[str, str],
    *,
    alpha: float = 1.0,
    norm_std: bool = True,
    filter_zero_variance: bool = False,
    grouping: str = "turn",
) -> StepBatches:
    """Mix rewards, group and compute advantages with the advantage estimator `grouping`
    (atgrpo.algo.registry; "turn": AT-GRPO's (task, agent, turn) groups within each episode,
    "trajectory": (task, agent) per episode over its K copies), filter, route by pool."""
    if not samples:
        return StepBatches({}, {}, 0)
    # Here, not at the top: the router starts without torch (a second of CPU that a local start's
    # rollout and trainer, importing theirs at the same moment, would wait on); the first step
    # imports it.
    import torch

    from atgrpo.algo.advantages import mix_rewards

    # (B,)
    rewards = mix_rewards(
        torch.tensor([s.team_reward for s in samples], dtype=torch.double),
        torch.tensor([s.local_reward for s in samples], dtype=torch.double),
        alpha,
    )
    est = estimate(grouping, samples, rewards, norm_std=norm_std)
    adv, flat, groups = est.advantages, est.zero_variance, est.groups  # (B,) each
    stats: dict[str, AgentStats] = defaultdict(AgentStats)
    seen_groups: set[int] = set()
    per_pool: dict[str, list[TrainSample]] = defaultdict(list)
    dropped = 0
    for i, s in enumerate(samples):
        st = stats[s.agent]
        st.samples += 1
        st.reward_sum += float(rewards[i])
        st.prompts_cut += s.prompt_truncated
        st.responses_cut += s.response_truncated
        g = int(groups[i])
        if g not in seen_groups:
            seen_groups.add(g)
            st.groups += 1
            st.zero_variance_groups += bool(flat[i])
        if filter_zero_variance and flat[i]:
            dropped += 1
            continue
        st.advantages.append(float(adv[i]))
        per_pool[pool_of[s.agent]].append(
            TrainSample(
                s.agent,
                s.prompt_ids,
                s.response_ids,
                s.logprobs,
                float(adv[i]),
                s.sampling,
                s.policy.version,
            )
        )
    return StepBatches(dict(per_pool), dict(stats), dropped, rewards.tolist(), adv.tolist())


def episode_metrics(ends: Sequence[EpisodeEnd]) -> dict[str, float]:
    """Success rate and mean turns over the episodes that finished (failed ones are counted
    apart)."""
    ok = [e for e in ends if not e.error]
    return {
        "episodes": float(len(ok)),
        "failed_episodes": float(len(ends) - len(ok)),
        "success_rate": sum(e.success for e in ok) / len(ok) if ok else 0.0,
        "turns_mean": sum(e.turns for e in ok) / len(ok) if ok else 0.0,
    }


# ---- collection plans ------------------------------------------------------------------------


def agent_plans(cfg: RunConfig, *, eval_mode: bool = False) -> dict[str, AgentPlan]:
    """Each agent's pool, adapter (its own name on a LoRA pool) and sampling settings."""
    out = {}
    for name in cfg.env.turn_order:
        a = cfg.agents[name]
        sampling = a.eval_sampling if eval_mode else a.train_sampling
        adapter = name if cfg.pools[a.pool].specialization == "lora" else ""
        out[name] = AgentPlan(name, a.pool, adapter, sampling, a.system_prompt or "")
    return out


def expected_versions(cfg: RunConfig, versions: Mapping[str, int]) -> tuple[PolicyRef, ...]:
    """The policies a step must be sampled from: each trainable pool's model, or each of its
    agents' adapters, at the version its trainer holds (`versions`: pool -> version)."""
    full = [
        PolicyRef(p, "", v) for p, v in versions.items() if cfg.pools[p].specialization != "lora"
    ]
    lora = [
        PolicyRef(a.pool, a.adapter, versions[a.pool])
        for a in agent_plans(cfg).values()
        if a.adapter and a.pool in versions
    ]
    return (*full, *lora)


def stale_tasks(
    samples: Sequence[Sample],
    pool_of: Mapping[str, str],
    pool: str,
    version: int,
    max_staleness: int,
) -> set[str]:
    """The tasks with a sample of `pool`'s agents drawn more than `max_staleness` versions behind
    `version` (the weights that would train it). A newer sample is not stale: a replica serves a
    pushed version a moment before its trainer's answer reaches the router."""
    return {
        s.task_id
        for s in samples
        if pool_of.get(s.agent) == pool and version - s.policy.version > max_staleness
    }


def collect_plan(
    cfg: RunConfig,
    tasks: Sequence[TaskRef],
    *,
    step: int,
    eval_mode: bool = False,
    versions: Mapping[str, int] | None = None,
) -> CollectPlan:
    """Training collects K-way trees, or K independent episodes per task for an estimator that
    asks for them (grouping "trajectory");
    evaluation one flat rollout per task with eval sampling. `versions` (pool -> version) pins the
    weights every replica must serve. Each task is numbered with its episode (its position, from
    1): the samples carry it back, and (task, episode) names the tree they are grouped in."""
    alg = cfg.algorithm
    train_mode = adv_estimator(alg.grouping).collect
    return CollectPlan(
        env=cfg.env.name,
        tasks=tuple(replace(t, episode=i) for i, t in enumerate(tasks, 1)),
        agents=agent_plans(cfg, eval_mode=eval_mode),
        turn_order=tuple(cfg.env.turn_order),
        max_turns=cfg.env.max_turns,
        k=1 if eval_mode else alg.k,
        mode="flat" if eval_mode else train_mode,
        selection="first" if eval_mode else alg.selection,
        parallel=cfg.env.parallel,
        parallel_credit=alg.parallel_credit,
        alpha=alg.alpha,
        env_options=env_options(cfg),
        max_concurrent_tasks=max(1, len(tasks)),
        expected_versions=expected_versions(cfg, versions) if versions else (),
        run_id=cfg.run.name,
        step=step,
    )

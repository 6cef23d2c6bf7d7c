"""The router's per-step logic as plain functions: which tasks a step collects, and how a step's
samples become each pool's training batch (DESIGN.md §1-2). No gRPC here."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from atgrpo.algo.advantages import group_advantages, group_index, mix_rewards
from atgrpo.sdk.env import seed_for
from rollout_svc.types import EpisodeEnd, Sample, TaskRef
from trainer_svc.update import TrainSample

# Runs with different seeds draw from disjoint stretches of the generated tasks.
_RUN_STRIDE = 10_000_000


def step_tasks(run_seed: int, step: int, count: int, split: str = "train",
               task_ids: Sequence[str] | None = None) -> list[TaskRef]:
    """The tasks of `step` (0-based): a pure function of (seed, step), so a resumed run collects
    exactly the tasks an uninterrupted one would.

    Generated tasks (task_ids None) are taken in order, each once; a finite task list is walked in
    a fresh seeded permutation per epoch.
    """
    if task_ids is None:
        first = run_seed * _RUN_STRIDE + step * count
        return [TaskRef(f"{split}-{i}", seed_for(split, i), split) for i in range(first, first + count)]
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


@dataclass
class StepBatches:
    per_pool: dict[str, list[TrainSample]]
    agents: dict[str, AgentStats]
    dropped: int                       # samples filtered out (zero-variance groups)


def step_batches(samples: Sequence[Sample], pool_of: Mapping[str, str], *, alpha: float = 1.0,
                 norm_std: bool = True, filter_zero_variance: bool = False) -> StepBatches:
    """Mix rewards, group by (task, agent, turn), compute advantages, filter, route by pool."""
    if not samples:
        return StepBatches({}, {}, 0)
    rewards = mix_rewards(torch.tensor([s.team_reward for s in samples], dtype=torch.double),
                          torch.tensor([s.local_reward for s in samples], dtype=torch.double), alpha)   # (B,)
    groups = group_index([(s.task_id, s.agent, s.turn) for s in samples])                           # (B,)
    adv, flat = group_advantages(rewards, groups, norm_std=norm_std)
    stats: dict[str, AgentStats] = defaultdict(AgentStats)
    seen_groups: set[int] = set()
    per_pool: dict[str, list[TrainSample]] = defaultdict(list)
    dropped = 0
    for i, s in enumerate(samples):
        st = stats[s.agent]
        st.samples += 1
        st.reward_sum += float(rewards[i])
        g = int(groups[i])
        if g not in seen_groups:
            seen_groups.add(g)
            st.groups += 1
            st.zero_variance_groups += bool(flat[i])
        if filter_zero_variance and flat[i]:
            dropped += 1
            continue
        st.advantages.append(float(adv[i]))
        per_pool[pool_of[s.agent]].append(TrainSample(s.agent, s.prompt_ids, s.response_ids, s.logprobs,
                                                      float(adv[i]), s.sampling))
    return StepBatches(dict(per_pool), dict(stats), dropped)


def episode_metrics(ends: Sequence[EpisodeEnd]) -> dict[str, float]:
    """Success rate and mean turns over the episodes that finished (failed ones are counted apart)."""
    ok = [e for e in ends if not e.error]
    return {"episodes": float(len(ok)), "failed_episodes": float(len(ends) - len(ok)),
            "success_rate": sum(e.success for e in ok) / len(ok) if ok else 0.0,
            "turns_mean": sum(e.turns for e in ok) / len(ok) if ok else 0.0}

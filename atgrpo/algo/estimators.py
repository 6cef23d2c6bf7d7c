"""The built-in advantage estimators, registered by name (atgrpo.algo.registry):

- `turn` (AT-GRPO): groups (task, agent, turn, episode), the K branches one agent sampled from
  one state; A = (r - mean_g) / (std_g + eps) (group_advantages).
- `trajectory` (the trajectory-level GRPO baseline): groups (task, agent, episode) over K
  independent copies of the episode, one return per copy (trajectory_advantages).
- `turn_loo`: `turn`'s groups, each sample's baseline the mean of the group's other branches
  (leave_one_out_advantages).
- the grouping ablation, the same tree samples with a coarser key (the paper's Table 3):
  `task` (task, episode): every agent and turn of a tree in one group; `task_agent` (task, agent,
  episode): one agent's turns together; `task_turn` (task, turn, episode): the agents of a turn
  together. `turn` is (task, agent, turn, episode).

A sample is any object with task_id, agent, turn, branch and episode
(atgrpo.contract.rollout.Sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from atgrpo.algo.advantages import (
    group_advantages,
    group_index,
    leave_one_out_advantages,
    trajectory_advantages,
)
from atgrpo.algo.registry import Estimate, register_adv_est


@register_adv_est("turn")
def at_grpo(samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool) -> Estimate:
    groups = group_index(_group_keys(samples))
    return Estimate(*group_advantages(rewards, groups, norm_std=norm_std), groups)


@register_adv_est("turn_loo")
def at_grpo_loo(samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool) -> Estimate:
    groups = group_index(_group_keys(samples))
    return Estimate(*leave_one_out_advantages(rewards, groups, norm_std=norm_std), groups)


def _keyed(attribute: str, *fields: str):
    """An estimator grouping tree samples by (fields..., episode), normalised as `turn` is; named
    as this module's `attribute`, where the registry's table of built-ins finds it."""

    def estimator(samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool) -> Estimate:
        _named_episodes(samples)
        groups = group_index([(*(getattr(s, f) for f in fields), s.episode) for s in samples])
        return Estimate(*group_advantages(rewards, groups, norm_std=norm_std), groups)

    estimator.__name__ = estimator.__qualname__ = attribute
    return estimator


by_task = register_adv_est("task")(_keyed("by_task", "task_id"))
by_task_agent = register_adv_est("task_agent")(_keyed("by_task_agent", "task_id", "agent"))
by_task_turn = register_adv_est("task_turn")(_keyed("by_task_turn", "task_id", "turn"))


@register_adv_est("trajectory", collect="trajectory")
def trajectory_grpo(samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool) -> Estimate:
    """The driver puts copy j's return on each of its samples (rollout_svc.tree); branch = j."""
    groups = group_index(_trajectory_keys(samples))
    copies = torch.tensor([s.branch for s in samples], dtype=torch.long)
    return Estimate(*trajectory_advantages(rewards, groups, copies, norm_std=norm_std), groups)


def _named_episodes(samples: Sequence[Any]) -> None:
    """Each sample names its run of its task (Sample.episode, from its TaskRef, numbered from 1 by
    the collection plan): without it two runs of one task in a step would share a group."""
    unnamed = next((s for s in samples if s.episode < 1), None)
    if unnamed is not None:
        raise ValueError(
            f"a sample of task {unnamed.task_id!r} (agent {unnamed.agent!r}) has episode "
            f"{unnamed.episode}: number each task of a collection plan from 1 (TaskRef.episode, as "
            "router_svc.steps.collect_plan does); the rollout service echoes it on every sample"
        )


def _group_keys(samples: Sequence[Any]) -> list[tuple]:
    """(task, agent, turn, episode) per sample. One step can run the same task twice (a finite task
    list repeats a task when a step straddles an epoch boundary, or holds fewer tasks than a step);
    each run is its own tree and its own group: each sample names its run (Sample.episode)."""
    _named_episodes(samples)
    return [(s.task_id, s.agent, s.turn, s.episode) for s in samples]


def _trajectory_keys(samples: Sequence[Any]) -> list[tuple]:
    """(task, agent, episode) per sample for grouping "trajectory": one group per agent over the
    K copies of one run of a task. A task run twice in a step is two groups."""
    _named_episodes(samples)
    return [(s.task_id, s.agent, s.episode) for s in samples]

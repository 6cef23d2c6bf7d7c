"""The built-in advantage estimators, registered by name (atgrpo.algo.registry):

- `turn` (AT-GRPO): groups (task, agent, turn, episode), the K branches one agent sampled from
  one state; A = (r - mean_g) / (std_g + eps) (group_advantages).
- `trajectory` (the trajectory-level GRPO baseline): groups (task, agent, episode) over K
  independent copies of the episode, one return per copy (trajectory_advantages).

A sample is any object with task_id, agent, turn, branch and episode
(atgrpo.contract.rollout.Sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from atgrpo.algo.advantages import group_advantages, group_index, trajectory_advantages
from atgrpo.algo.registry import Estimate, register_adv_est


@register_adv_est("turn")
def at_grpo(samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool) -> Estimate:
    groups = group_index(_group_keys(samples))
    return Estimate(*group_advantages(rewards, groups, norm_std=norm_std), groups)


@register_adv_est("trajectory", collect="trajectory")
def trajectory_grpo(samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool) -> Estimate:
    """The driver puts copy j's return on each of its samples (rollout_svc.tree); branch = j."""
    groups = group_index(_trajectory_keys(samples))
    copies = torch.tensor([s.branch for s in samples], dtype=torch.long)
    return Estimate(*trajectory_advantages(rewards, groups, copies, norm_std=norm_std), groups)


def _numbered(samples: Sequence[Any]) -> bool:
    """Whether every sample names its episode (a rollout service that echoes TaskRef.episode)."""
    return all(s.episode > 0 for s in samples)


def _group_keys(samples: Sequence[Any]) -> list[tuple]:
    """(task, agent, turn, episode) per sample. One step can run the same task twice (a finite task
    list repeats a task when a step straddles an epoch boundary, or holds fewer tasks than a step);
    each run is its own tree and its own group: each sample names its run (Sample.episode)."""
    if _numbered(samples):
        return [(s.task_id, s.agent, s.turn, s.episode) for s in samples]
    return _arrival_group_keys(samples)


def _trajectory_keys(samples: Sequence[Any]) -> list[tuple]:
    """(task, agent, episode) per sample for grouping "trajectory": one group per agent over the
    K copies of one run of a task. A task run twice in a step is two groups."""
    if _numbered(samples):
        return [(s.task_id, s.agent, s.episode) for s in samples]
    return _arrival_trajectory_keys(samples)


# --- unnumbered samples (a rollout service from before Sample.episode): runs by arrival order ---


def _arrival_group_keys(samples: Sequence[Any]) -> list[tuple]:
    """A task's episodes are emitted whole, one after another, and each (agent, turn) of an
    episode holds branches 0..K-1 once, so the n-th sample seen with a given (task, agent, turn,
    branch) belongs to that task's n-th episode."""
    seen: dict[tuple, int] = {}
    keys = []
    for s in samples:
        b = (s.task_id, s.agent, s.turn, s.branch)
        n = seen[b] = seen.get(b, -1) + 1
        keys.append((s.task_id, s.agent, s.turn, n))
    return keys


def _arrival_trajectory_keys(samples: Sequence[Any]) -> list[tuple]:
    """Counting occurrences as _arrival_group_keys does would not do here: a turn that only the
    second run reached would count as the first run's and join its group. Instead, as a task's
    runs are emitted whole one after another, a sample whose (agent, turn, branch) the task's
    current run already holds starts its next run (each run begins with copy 0's first sample,
    which every run has)."""
    run: dict[str, int] = {}
    held: dict[str, set[tuple]] = {}
    keys = []
    for s in samples:
        mark = (s.agent, s.turn, s.branch)
        if mark in held.setdefault(s.task_id, set()):
            run[s.task_id] = run.get(s.task_id, 0) + 1
            held[s.task_id] = set()
        held[s.task_id].add(mark)
        keys.append((s.task_id, s.agent, run.get(s.task_id, 0)))
    return keys

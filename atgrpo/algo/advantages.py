"""AT-GRPO rewards, groups and advantages as pure functions (Zhao et al., arXiv 2510.11062, §3;
DESIGN.md §1).

Groups are keyed by (task, agent, turn): exactly the K branches one agent sampled from one state.
Different tasks or turns are never pooled, and nothing but real samples joins a group (both are
bugs of the reference implementation, reference-system.md §1).

The trajectory-level baseline (algorithm.grouping: trajectory) groups per (task, agent) over K
independent copies of the episode instead; trajectory_advantages normalises one return per copy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

FLAT_TOLERANCE = 1e-9  # relative spread below which a group's rewards count as equal


def mix_rewards(team: torch.Tensor, local: torch.Tensor, alpha: float) -> torch.Tensor:
    """The training reward r = alpha * team + local.  team, local: (B,) -> (B,)."""
    return alpha * team + local


def group_index(keys: Sequence[Hashable]) -> torch.Tensor:
    """Dense group ids for per-sample keys, in order of first appearance.

    keys: B hashables, e.g. (task_id, agent, turn) -> (B,) int64 in [0, G).
    """
    ids: dict[Hashable, int] = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def group_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, *, norm_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised advantages and which samples sit in a zero-variance group.

    A = (r - mean_g) / (std_g + eps) with the unbiased std of the sample's group g; with
    norm_std=False, A = r - mean_g (Dr. GRPO). A group whose rewards are all equal (within
    FLAT_TOLERANCE; a singleton group included) carries no signal: its samples get A = 0 exactly.

    rewards: (B,) float; groups: (B,) int64 in [0, G). Returns (A (B,), zero_variance (B,) bool).
    """
    rewards = rewards.double()
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    count, mean, std = _group_moments(rewards, groups, n_groups)  # (G,) each
    centred = rewards - mean[groups]  # (B,)
    # "All equal" is decided on the spread of the values, with a tolerance for float noise:
    # 0.1 + 0.2 and 0.3 are the same reward, and dividing their 5e-17 difference by a 4e-17 std
    # would turn noise into advantages of +-0.7.
    lo = torch.full((n_groups,), float("inf"), dtype=torch.double).scatter_reduce(
        0, groups, rewards, "amin"
    )
    hi = torch.full((n_groups,), float("-inf"), dtype=torch.double).scatter_reduce(
        0, groups, rewards, "amax"
    )
    # (B,)
    flat = ((hi - lo) <= FLAT_TOLERANCE * torch.maximum(hi.abs(), torch.ones_like(hi)))[groups]
    adv = centred / (std[groups] + eps) if norm_std else centred
    adv = torch.where(flat, torch.zeros_like(adv), adv)
    return adv.float(), flat


def leave_one_out_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, *, norm_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out (RLOO) advantages: each sample's baseline is the mean of the others in its
    group, A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean_g); with norm_std, divided by the
    group's unbiased std + eps as group_advantages does. A group whose rewards are all equal (a
    singleton included: it has no others) gives A = 0 exactly.

    rewards: (B,) float; groups: (B,) int64 in [0, G). Returns (A (B,), zero_variance (B,) bool).
    """
    centred, flat = group_advantages(rewards, groups, norm_std=False)  # r_i - mean_g, 0 if flat
    if not rewards.numel():
        return centred, flat
    count, _, std = _group_moments(rewards.double(), groups, int(groups.max()) + 1)
    n = count[groups]  # (B,)
    adv = centred.double() * n / (n - 1).clamp(min=1)
    if norm_std:
        adv = adv / (std[groups] + eps)
    return torch.where(flat, torch.zeros_like(adv), adv).float(), flat


def _group_moments(
    rewards: torch.Tensor, groups: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group: the sample count, the mean and the unbiased std (0 for a singleton).

    rewards: (B,) float64; groups: (B,) int64 in [0, n_groups). Returns three (G,) float64."""
    count = torch.zeros(n_groups, dtype=torch.double).index_add_(
        0, groups, torch.ones_like(rewards)
    )
    mean = torch.zeros(n_groups, dtype=torch.double).index_add_(0, groups, rewards) / count
    sq = torch.zeros(n_groups, dtype=torch.double).index_add_(
        0, groups, (rewards - mean[groups]) ** 2
    )
    return count, mean, torch.sqrt(sq / (count - 1).clamp(min=1))


def trajectory_advantages(
    returns: torch.Tensor,
    groups: torch.Tensor,
    copies: torch.Tensor,
    *,
    norm_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Trajectory-level GRPO: every sample of a copy gets its copy's advantage.

    A group (task, agent) holds K copies of one episode; copy j's return R_j sits on each of its
    samples. A_j = (R_j - mean) / (std + eps) with the mean and unbiased std over the group's
    copies, one value per copy, so a copy with more turns (more samples) does not weigh more;
    norm_std=False gives R_j - mean. Equal returns (a single copy included) give A = 0.

    returns: (B,) float, the same within a copy; groups: (B,) int64 in [0, G); copies: (B,) int64,
    the copy index within its group. Returns (A (B,), zero_variance (B,) bool), as group_advantages.
    """
    if not returns.numel():
        return returns.float(), torch.zeros(0, dtype=torch.bool)
    pair = group_index(list(zip(groups.tolist(), copies.tolist(), strict=True)))  # (B,) in [0, P)
    n_pairs = int(pair.max()) + 1
    count = torch.zeros(n_pairs, dtype=torch.double).index_add_(
        0, pair, torch.ones_like(returns, dtype=torch.double)
    )
    # The copy's samples all carry R_j; their mean is R_j (and stays defined if float noise
    # differs).
    # (P,)
    per_copy = (
        torch.zeros(n_pairs, dtype=torch.double).index_add_(0, pair, returns.double()) / count
    )
    copy_group = torch.zeros(n_pairs, dtype=torch.long).scatter_(0, pair, groups)  # (P,)
    adv, flat = group_advantages(per_copy, copy_group, norm_std=norm_std, eps=eps)  # (P,)
    return adv[pair], flat[pair]


def zero_variance_keep(flat: torch.Tensor) -> torch.Tensor:
    """The DAPO filter's mask: keep the samples whose group has any reward variance.  (B,) bool."""
    return ~flat

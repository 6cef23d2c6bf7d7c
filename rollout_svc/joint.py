"""A parallel turn's scoring (rollout_svc.tree's joint actions): each joint action's outcome, each
agent's result in it, and, under all_pairs credit, which joint actions are scored and how an
answer is credited over those it took part in. Pure functions of step results."""

from __future__ import annotations

import random

from atgrpo.contract.env import StepResult


def turn_outcomes(steps: list[list[StepResult | None]]) -> list[StepResult]:
    """Per branch, the parallel turn's outcome: the last step applied there
    (steps[agent][branch])."""
    return [next(s[b] for s in reversed(steps) if s[b] is not None) for b in range(len(steps[0]))]


def scored(own: StepResult | None, outcome: StepResult) -> StepResult:
    """One agent's result on one branch of a parallel turn: the turn's team reward, done and
    success, with the agent's own local reward and info (0 and "skipped" when the turn ended
    first)."""
    if own is None:
        return StepResult(
            outcome.team_reward,
            0.0,
            outcome.done,
            outcome.success,
            {"skipped": "the turn ended on this branch before this agent acted"},
            outcome.turn,
        )
    return StepResult(
        outcome.team_reward, own.local_reward, outcome.done, outcome.success, own.info, own.turn
    )


def credit_shifts(agents: int, k: int, key: str) -> list[tuple[int, ...]]:
    """all_pairs credit: the partners' offsets from an answer's own index, each giving K joint
    actions in which every answer of every agent appears once. Two agents: every nonzero
    offset, so each answer meets every partner answer (K x K in all). More: K - 1 of the
    K^(n-1) - 1 nonzero offset vectors, drawn without replacement from `key` (the same tree, the
    same draw), so each answer meets K partner combinations (its diagonal one among them): the
    cost of two agents."""
    if agents == 2:
        return [(0, s) for s in range(1, k)]
    total = k ** (agents - 1) - 1
    picks = random.Random(key).sample(range(1, total + 1), min(k - 1, total))
    return [(0, *(p // k**i % k for i in range(agents - 1))) for p in picks]


def credited(row: list[StepResult], branch_of: list[int], k: int) -> list[StepResult]:
    """Each of one agent's K answers credited over the joint actions it took part in (row[c] its
    result in joint action c, branch_of[c] which answer it gave there): the mean team and local
    reward, with done, success and info of its diagonal joint action (c = its own index). Paired
    credit (one joint action per answer) returns the diagonal results unchanged."""
    if len(row) == k:
        return row[:k]
    out = []
    for b in range(k):
        mine = [r for r, own in zip(row, branch_of, strict=True) if own == b]
        diag = row[b]
        out.append(
            StepResult(
                sum(r.team_reward for r in mine) / len(mine),
                sum(r.local_reward for r in mine) / len(mine),
                diag.done,
                diag.success,
                {
                    **diag.info,
                    "credit_joint_actions": len(mine),
                    "paired_team_reward": diag.team_reward,
                },
                diag.turn,
            )
        )
    return out

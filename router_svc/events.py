"""A step's, an evaluation's and a rollback's event records (one JSON line each in metrics.jsonl).

The dict is the record: the run directory keeps it, WatchRun replays it (atgrpo.contract.run_wire),
and the CLI draws its curves from it, so the three never disagree.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from atgrpo.contract.rollout import EpisodeEnd
from atgrpo.contract.run import rollback_dict
from router_svc.plan import StepBatches, episode_metrics


def step_event(step: int, batches: StepBatches, ends: Sequence[EpisodeEnd], pools: Mapping[str, Mapping[str, Any]],
               timings: Mapping[str, float], order: Sequence[str] = ()) -> dict[str, Any]:
    """Step metrics: the team's success, per agent (reward, groups, advantages), per pool (update).
    Agents are listed in `order` (the turn order) first."""
    ep = episode_metrics(ends)
    agents = {}
    names = [a for a in order if a in batches.agents] + [a for a in batches.agents if a not in order]
    for name, st in ((n, batches.agents[n]) for n in names):
        adv = st.advantages
        agents[name] = {
            "reward_mean": st.reward_sum / st.samples if st.samples else 0.0,
            "success_rate": ep["success_rate"], "turns_mean": ep["turns_mean"],
            "samples": st.samples, "groups": st.groups,
            "zero_variance_fraction": st.zero_variance_groups / st.groups if st.groups else 0.0,
            "advantage_mean": statistics.fmean(adv) if adv else 0.0,
            "advantage_std": statistics.pstdev(adv) if len(adv) > 1 else 0.0,
            "prompt_truncated_fraction": st.prompts_cut / st.samples if st.samples else 0.0,
            "response_truncated_fraction": st.responses_cut / st.samples if st.samples else 0.0,
        }
    samples = sum(a["samples"] for a in agents.values())
    reward = sum(a["reward_mean"] * a["samples"] for a in agents.values()) / samples if samples else 0.0
    return {"kind": "step", "step": step, "success_rate": ep["success_rate"], "reward_mean": reward,
            "episodes": int(ep["episodes"]), "failed_episodes": int(ep["failed_episodes"]),
            "dropped_samples": batches.dropped, "agents": agents, "pools": {p: dict(m) for p, m in pools.items()},
            **timings}


def eval_event(step: int, ends: Sequence[EpisodeEnd], order: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluation: success over the eval tasks, and each agent's mean return (its rewards summed over
    an episode's turns) over the episodes; a step event's agent reward_mean is per sample instead."""
    ok = [e for e in ends if not e.error]
    seen = {a for e in ok for a in e.agent_rewards}
    names = [a for a in order if a in seen] + sorted(seen - set(order))
    agents = {a: {"reward_mean": statistics.fmean(e.agent_rewards.get(a, 0.0) for e in ok),
                  "turns_mean": statistics.fmean(e.turns for e in ok)} for a in names}
    ep = episode_metrics(ends)
    return {"kind": "eval", "step": step, "success_rate": ep["success_rate"], "episodes": int(ep["episodes"]),
            "failed_episodes": int(ep["failed_episodes"]), "agents": agents}


def rollback_event(from_step: int, to_step: int, checkpoint: str, recorded: Mapping[str, int],
                   held: Mapping[str, int], reloaded: Sequence[str] = ()) -> dict[str, Any] | None:
    """The record of going back from step `from_step` to the checkpoint of `to_step`, or None when
    the run continues where it was. `recorded`: pool -> version after `from_step` (state.json);
    `held`: the versions the trainers came back with (a restarted trainer loads the checkpoint);
    `reloaded`: pools that kept their weights but were sent back to the checkpoint with the others."""
    if to_step >= from_step:
        return None
    lost = [f"trainer {p!r} restarted and lost its weights (it came back with version {v}, the checkpoint's; "
            f"step {from_step} had left version {recorded.get(p)})"
            for p, v in held.items() if v != recorded.get(p)]
    reason = "; ".join(lost) or f"the trainers hold the versions of the checkpoint of step {to_step}"
    if reloaded:
        reason += f"; pool(s) {list(reloaded)} went back to the checkpoint too, so every pool holds the same step"
    return rollback_dict(from_step, to_step, checkpoint, reason)

"""A run's events as plain dicts (one JSON line each in metrics.jsonl) and as RunEvent messages.

The dict is the record: the run directory keeps it, WatchRun replays it, and the CLI draws its
curves from it, so the three never disagree.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from atgrpo._proto.v1 import router_pb2 as pb
from rollout_svc.types import EpisodeEnd
from router_svc.plan import StepBatches, episode_metrics

STATE_NAMES = {
    pb.RUN_STATE_STARTING: "starting", pb.RUN_STATE_RUNNING: "running", pb.RUN_STATE_STOPPING: "stopping",
    pb.RUN_STATE_STOPPED: "stopped", pb.RUN_STATE_FINISHED: "finished", pb.RUN_STATE_FAILED: "failed",
}
STATES = {v: k for k, v in STATE_NAMES.items()}
FINAL_STATES = ("stopped", "finished", "failed")


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


def status_dict(run_id: str, state: str, step: int, total: int, run_dir: str, resumed_from: int = 0,
                error: str = "") -> dict[str, Any]:
    return {"kind": "status", "run_id": run_id, "state": state, "step": step, "total_steps": total,
            "run_dir": run_dir, "resumed_from_step": resumed_from, "error": error}


def status_to_pb(s: Mapping[str, Any]) -> pb.RunStatus:
    return pb.RunStatus(run_id=s["run_id"], state=STATES[s["state"]], step=s["step"], total_steps=s["total_steps"],
                        run_dir=s["run_dir"], resumed_from_step=s["resumed_from_step"], error=s["error"])


def status_from_pb(m: pb.RunStatus) -> dict[str, Any]:
    return status_dict(m.run_id, STATE_NAMES.get(m.state, "unknown"), m.step, m.total_steps, m.run_dir,
                       m.resumed_from_step, m.error)


_AGENT_STEP = ("reward_mean", "success_rate", "turns_mean", "samples", "groups", "zero_variance_fraction",
               "advantage_mean", "advantage_std", "prompt_truncated_fraction", "response_truncated_fraction")
_POOL_STEP = ("version", "loss", "approx_kl", "clip_fraction", "grad_norm", "entropy", "push_seconds", "push_bytes")


def to_pb(run_id: str, e: Mapping[str, Any]) -> pb.RunEvent:
    if e["kind"] == "status":
        return pb.RunEvent(run_id=run_id, status=status_to_pb(e))
    if e["kind"] == "eval":
        return pb.RunEvent(run_id=run_id, eval=pb.EvalEvent(
            step=e["step"], success_rate=e["success_rate"], episodes=e["episodes"],
            agents={a: pb.AgentEvalMetrics(**m) for a, m in e["agents"].items()}))
    return pb.RunEvent(run_id=run_id, step=pb.StepEvent(
        step=e["step"], success_rate=e["success_rate"], reward_mean=e["reward_mean"],
        agents={a: pb.AgentStepMetrics(**{k: m[k] for k in _AGENT_STEP}) for a, m in e["agents"].items()},
        pools={p: pb.PoolStepMetrics(agents=m.get("agents", {}), **{k: m[k] for k in _POOL_STEP if k in m})
               for p, m in e["pools"].items()},
        rollout_seconds=e["rollout_seconds"], train_seconds=e["train_seconds"],
        weight_sync_seconds=e["weight_sync_seconds"]))


def from_pb(m: pb.RunEvent) -> dict[str, Any]:
    """The dict of a RunEvent (the CLI's view; fields the message lacks are absent)."""
    kind = m.WhichOneof("event")
    if kind == "status":
        return status_from_pb(m.status)
    if kind == "eval":
        e = m.eval
        return {"kind": "eval", "step": e.step, "success_rate": e.success_rate, "episodes": e.episodes,
                "agents": {a: {"reward_mean": v.reward_mean, "turns_mean": v.turns_mean} for a, v in e.agents.items()}}
    s = m.step
    return {"kind": "step", "step": s.step, "success_rate": s.success_rate, "reward_mean": s.reward_mean,
            "agents": {a: {k: getattr(v, k) for k in _AGENT_STEP} for a, v in s.agents.items()},
            "pools": {p: {"agents": dict(v.agents), **{k: getattr(v, k) for k in _POOL_STEP}}
                      for p, v in s.pools.items()},
            "rollout_seconds": s.rollout_seconds, "train_seconds": s.train_seconds,
            "weight_sync_seconds": s.weight_sync_seconds}

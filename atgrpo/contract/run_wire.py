"""Protobuf <-> a run's status and event dicts (atgrpo.contract.run): StartRun, WatchRun, GetRun."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atgrpo._proto.v1 import router_pb2 as pb
from atgrpo.contract.run import STEP_TIMING, rollback_dict, status_dict

STATE_NAMES = {
    pb.RUN_STATE_STARTING: "starting",
    pb.RUN_STATE_RUNNING: "running",
    pb.RUN_STATE_STOPPING: "stopping",
    pb.RUN_STATE_STOPPED: "stopped",
    pb.RUN_STATE_FINISHED: "finished",
    pb.RUN_STATE_FAILED: "failed",
}
STATES = {v: k for k, v in STATE_NAMES.items()}


def status_to_pb(s: Mapping[str, Any]) -> pb.RunStatus:
    return pb.RunStatus(
        run_id=s["run_id"],
        state=STATES[s["state"]],
        step=s["step"],
        total_steps=s["total_steps"],
        run_dir=s["run_dir"],
        resumed_from_step=s["resumed_from_step"],
        error=s["error"],
    )


def status_from_pb(m: pb.RunStatus) -> dict[str, Any]:
    return status_dict(
        m.run_id,
        STATE_NAMES.get(m.state, "unknown"),
        m.step,
        m.total_steps,
        m.run_dir,
        m.resumed_from_step,
        m.error,
    )


_AGENT_STEP = (
    "reward_mean",
    "success_rate",
    "turns_mean",
    "samples",
    "groups",
    "zero_variance_fraction",
    "advantage_mean",
    "advantage_std",
    "prompt_truncated_fraction",
    "response_truncated_fraction",
)
_POOL_STEP = (
    "version",
    "loss",
    "approx_kl",
    "clip_fraction",
    "grad_norm",
    "entropy",
    "push_seconds",
    "push_bytes",
    "staleness_max",
    "masked_tokens",
    "dropped_stale",
    "staleness_mean",
)


def event_to_pb(run_id: str, e: Mapping[str, Any]) -> pb.RunEvent:
    if e["kind"] == "status":
        return pb.RunEvent(run_id=run_id, status=status_to_pb(e))
    if e["kind"] == "rollback":
        return pb.RunEvent(
            run_id=run_id,
            rollback=pb.RollbackEvent(
                from_step=e["from_step"],
                to_step=e["to_step"],
                checkpoint=e["checkpoint"],
                reason=e["reason"],
            ),
        )
    if e["kind"] == "eval":
        return pb.RunEvent(
            run_id=run_id,
            eval=pb.EvalEvent(
                step=e["step"],
                success_rate=e["success_rate"],
                episodes=e["episodes"],
                failed_episodes=e.get("failed_episodes", 0),
                agents={a: pb.AgentEvalMetrics(**m) for a, m in e["agents"].items()},
            ),
        )
    return pb.RunEvent(
        run_id=run_id,
        step=pb.StepEvent(
            step=e["step"],
            success_rate=e["success_rate"],
            reward_mean=e["reward_mean"],
            agents={
                a: pb.AgentStepMetrics(**{k: m[k] for k in _AGENT_STEP})
                for a, m in e["agents"].items()
            },
            pools={
                p: pb.PoolStepMetrics(
                    agents=m.get("agents", {}),
                    kl_ref=m.get("kl_ref"),
                    memory=m.get("memory", {}),
                    mismatch=m.get("mismatch", {}),
                    **{k: m[k] for k in _POOL_STEP if k in m},
                )
                for p, m in e["pools"].items()
            },
            rollout_seconds=e["rollout_seconds"],
            train_seconds=e["train_seconds"],
            weight_sync_seconds=e["weight_sync_seconds"],
            retries=e.get("retries", 0),
            timing={k: float(e[k]) for k in STEP_TIMING if k in e},
            replicas=e.get("replicas", {}),
            requeued_tasks=e.get("requeued_tasks", 0),
        ),
    )


def event_from_pb(m: pb.RunEvent) -> dict[str, Any]:
    """The dict of a RunEvent (the CLI's view; fields the message lacks are absent)."""
    kind = m.WhichOneof("event")
    if kind == "status":
        return status_from_pb(m.status)
    if kind == "rollback":
        r = m.rollback
        return rollback_dict(r.from_step, r.to_step, r.checkpoint, r.reason)
    if kind == "eval":
        e = m.eval
        return {
            "kind": "eval",
            "step": e.step,
            "success_rate": e.success_rate,
            "episodes": e.episodes,
            "failed_episodes": e.failed_episodes,
            "agents": {
                a: {"reward_mean": v.reward_mean, "turns_mean": v.turns_mean}
                for a, v in e.agents.items()
            },
        }
    s = m.step
    return {
        "kind": "step",
        "step": s.step,
        "success_rate": s.success_rate,
        "reward_mean": s.reward_mean,
        "agents": {a: {k: getattr(v, k) for k in _AGENT_STEP} for a, v in s.agents.items()},
        "pools": {
            p: {
                "agents": dict(v.agents),
                **{k: getattr(v, k) for k in _POOL_STEP},
                **({"kl_ref": v.kl_ref} if v.HasField("kl_ref") else {}),
                **({"memory": dict(v.memory)} if v.memory else {}),
                **({"mismatch": dict(v.mismatch)} if v.mismatch else {}),
            }
            for p, v in s.pools.items()
        },
        "rollout_seconds": s.rollout_seconds,
        "train_seconds": s.train_seconds,
        "weight_sync_seconds": s.weight_sync_seconds,
        "retries": s.retries,
        "replicas": dict(s.replicas),
        "requeued_tasks": s.requeued_tasks,
        **{k: s.timing[k] for k in STEP_TIMING if k in s.timing},
    }

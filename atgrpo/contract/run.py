"""A run as the router reports it and the CLI follows it: status and event records as plain dicts.

Events are dicts (`kind`: "status", "step", "eval" or "rollback"), one JSON line each in a run
directory's metrics.jsonl (atgrpo.rundir); WatchRun carries the same dicts
(atgrpo.contract.run_wire), so the record, the stream and the curves never disagree.
"""

from __future__ import annotations

from typing import Any

FINAL_STATES = ("stopped", "finished", "failed")

# A step record's breakdown of its time and its FLOP rates (router_svc.events.timing_fields;
# docs/observability.md, "A step's time"): top-level fields of a step event, carried by WatchRun in
# StepEvent.timing. The rates are absent when nothing measured them.
STEP_TIMING = (
    "time_prefill_s",
    "time_decode_s",
    "time_env_s",
    "time_wait_s",
    "prefill_tokens",
    "decode_tokens",
    "gen_flops_per_s",
    "gen_mfu",
    "gen_matmul_flops_per_s",
    "time_forward_s",
    "time_backward_s",
    "time_optimizer_s",
    "update_tokens",
    "update_flops_per_s",
    "update_mfu",
    "update_matmul_flops_per_s",
)


def status_dict(
    run_id: str,
    state: str,
    step: int,
    total: int,
    run_dir: str,
    resumed_from: int = 0,
    error: str = "",
) -> dict[str, Any]:
    return {
        "kind": "status",
        "run_id": run_id,
        "state": state,
        "step": step,
        "total_steps": total,
        "run_dir": run_dir,
        "resumed_from_step": resumed_from,
        "error": error,
    }


def rollback_dict(from_step: int, to_step: int, checkpoint: str, reason: str) -> dict[str, Any]:
    """The run went back from `from_step` to the checkpoint of `to_step`; the steps after it are
    done again and their earlier events no longer count. Its `step` is `to_step`, so the record
    outlives the truncation of metrics.jsonl to that step (atgrpo.rundir) and a later rollback to
    it."""
    return {
        "kind": "rollback",
        "step": to_step,
        "from_step": from_step,
        "to_step": to_step,
        "checkpoint": checkpoint,
        "reason": reason,
    }

"""A run as the router reports it and the CLI follows it: status and event records as plain dicts.

Events are dicts (`kind`: "status", "step" or "eval"), one JSON line each in a run directory's
metrics.jsonl (atgrpo.rundir); WatchRun carries the same dicts (atgrpo.contract.run_wire), so the
record, the stream and the curves never disagree.
"""

from __future__ import annotations

from typing import Any

FINAL_STATES = ("stopped", "finished", "failed")


def status_dict(run_id: str, state: str, step: int, total: int, run_dir: str, resumed_from: int = 0,
                error: str = "") -> dict[str, Any]:
    return {"kind": "status", "run_id": run_id, "state": state, "step": step, "total_steps": total,
            "run_dir": run_dir, "resumed_from_step": resumed_from, "error": error}

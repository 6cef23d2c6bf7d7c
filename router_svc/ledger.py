"""The run's ledger: how far it has come (the last recorded step, each pool's version, the
checkpoints on disk) and how a step, an evaluation or a checkpoint is recorded.

The loop (loop.py) and the pipeline (pipeline.py) share one Ledger. A step's event is on disk
before state.json counts it (a crash between the two leaves an event the resume drops and redoes,
never a counted step without its event)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atgrpo.rundir import Checkpoint, Progress, RunDir
from router_svc import metrics


class Ledger:
    """One run's progress and its records (metrics.jsonl, state.json, Prometheus)."""

    def __init__(
        self,
        run_name: str,
        run_dir: RunDir,
        emit: Callable[[dict[str, Any]], None] = lambda e: None,
    ):
        self.run_name, self.dir, self.emit = run_name, run_dir, emit
        self.completed = 0  # the last step recorded
        self.versions: dict[str, int] = {}  # pool -> the version its trainer holds
        # on disk, oldest first; the last is what a resume loads
        self.checkpoints: list[Checkpoint] = []
        self.retries = 0  # faults recovered from since the last recorded step
        self.replicas: dict[str, int] = {}  # pool -> replicas the last collection ran on
        self.requeued = 0  # tasks collected again (their replica lost) since the last step

    def observe_collect(self, replicas: dict[str, list[str]], requeued: int) -> None:
        """A collection ran on `replicas` (pool -> addresses), `requeued` tasks moved after a
        replica was lost."""
        self.replicas = {p: len(a) for p, a in replicas.items()}
        self.requeued += requeued
        metrics.observe_collect(self.run_name, self.replicas, requeued)

    def take_fleet(self) -> dict[str, Any]:
        """For a step's event: the replicas per pool, and the tasks requeued since the last."""
        n, self.requeued = self.requeued, 0
        return {"replicas": dict(self.replicas), "requeued_tasks": n}

    def record(self, event: dict[str, Any]) -> None:
        """An event to metrics.jsonl, the Prometheus gauges and whoever watches the run."""
        self.dir.append_event(event)
        metrics.observe_event(self.run_name, event)
        self.emit(event)

    def write_progress(self, versions: dict[str, int] | None = None) -> None:
        """state.json; `versions`: each pool's after self.completed (default: what the pools hold
        now)."""
        last = self.checkpoints[-1] if self.checkpoints else None
        self.dir.write_progress(
            Progress(
                self.run_name,
                self.completed,
                dict(versions or self.versions),
                last,
                list(self.checkpoints),
            )
        )

    def complete(
        self, step: int, event: dict[str, Any], versions: dict[str, int] | None = None
    ) -> None:
        """Step `step` is done: its event is on disk before state.json says so."""
        self.completed = step
        self.record(event)
        self.write_progress(versions)

    def take_retries(self) -> int:
        """The faults recovered from since the last recorded step (for its event), counted
        afresh."""
        n, self.retries = self.retries, 0
        return n

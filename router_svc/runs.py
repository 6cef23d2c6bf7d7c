"""The router's runs: one RunLoop at a time in the background, its status, and its event log.

WatchRun subscribers read the same list the loop appends to (replayed from metrics.jsonl after a
restart), so a late watcher sees every step and evaluation once, then the live ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from atgrpo.config import EVALUATE_START, RunConfig
from atgrpo.contract.run import FINAL_STATES, status_dict
from atgrpo.errors import FailedPrecondition, NotFound
from router_svc import metrics
from router_svc.loop import RunLoop

log = logging.getLogger("atgrpo.router")


class Run:
    def __init__(self, cfg: RunConfig, loop_factory=RunLoop):
        self.cfg = cfg
        self.id = cfg.run.name
        self.state = "starting"
        self.error = ""
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Condition()
        self.loop = loop_factory(cfg, emit=self._append)
        self.task: asyncio.Task | None = None

    def status(self) -> dict[str, Any]:
        return status_dict(
            self.id,
            self.state,
            self.loop.ledger.completed,
            self.cfg.run.steps,
            str(Path(self.cfg.run.run_dir).resolve()),
            self.loop.resumed_from,
            self.error,
        )

    def _append(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _set_state(self, state: str, error: str = "") -> None:
        self.state, self.error = state, error
        metrics.observe_state(self.id, state)
        self._append(self.status())

    async def _main(self) -> None:
        try:
            if self.cfg.run.evaluate_checkpoint:
                self._set_state("running")
                where = self.cfg.run.evaluate_checkpoint
                final = await self.loop.evaluate_checkpoint(
                    None if where == EVALUATE_START else Path(where)
                )
            else:
                await self.loop.prepare()
                # a resumed run's earlier steps, for watchers
                self.events = self.loop.dir.read_events()
                self._set_state("stopping" if self.loop.stop_requested.is_set() else "running")
                final = await self.loop.run()
            self._set_state(final)
        except asyncio.CancelledError:
            self._set_state("stopped", "the router shut down")
            raise
        except Exception as err:  # the run fails; the router keeps serving
            log.exception("run %s failed", self.id)
            self._set_state("failed", f"{type(err).__name__}: {err}")
        finally:
            await self.loop.clients.close()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._main())

    def stop(self) -> None:
        self.loop.stop_requested.set()
        if self.state in ("starting", "running"):
            self._set_state("stopping")

    async def watch(self, from_step: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Every event at or after `from_step` (status events always), until the run ends.

        Rollbacks are sent always too, and the steps after one are sent again from its to_step + 1:
        a watcher may hold steps the rollback undid, whichever step it asked to start from. Sending
        a rollback it has already acted on costs a resend, never a wrong record."""
        sent = 0
        while True:
            async with self._changed:
                while sent >= len(self.events) and self.state not in FINAL_STATES:
                    await self._changed.wait()
            while sent < len(self.events):
                e = self.events[sent]
                sent += 1
                if e["kind"] == "rollback":
                    from_step = min(from_step, e["to_step"] + 1)
                if e["kind"] in ("status", "rollback") or e["step"] >= from_step:
                    yield e
            if self.state in FINAL_STATES and sent >= len(self.events):
                return


class Runs:
    """One active run per router; a finished or stopped run can be started again (it resumes)."""

    def __init__(self, loop_factory=RunLoop):
        self._runs: dict[str, Run] = {}
        self._factory = loop_factory

    def start(self, cfg: RunConfig) -> Run:
        run = self._runs.get(cfg.run.name)
        if run is not None and run.state not in FINAL_STATES:
            return run  # StartRun is idempotent while it runs
        busy = [r.id for r in self._runs.values() if r.state not in FINAL_STATES]
        if busy:
            raise FailedPrecondition(
                f"this router is running {busy[0]!r}; stop it (StopRun) or use another router"
            )
        run = Run(cfg, self._factory)
        self._runs[cfg.run.name] = run
        run.start()
        return run

    def get(self, run_id: str) -> Run:
        if not run_id and len(self._runs) == 1:
            return next(iter(self._runs.values()))
        if run_id not in self._runs:
            known = ", ".join(sorted(self._runs)) or "none"
            raise NotFound(
                f"no run {run_id!r} on this router (runs: {known}); start it with StartRun"
            )
        return self._runs[run_id]

    async def stop_all(self) -> None:
        """Ask every active run to stop after its step in flight (with a checkpoint), and wait."""
        active = [r for r in self._runs.values() if r.task and not r.task.done()]
        for run in active:
            run.stop()
        await asyncio.gather(*(r.task for r in active), return_exceptions=True)

    async def shutdown(self) -> None:
        for run in self._runs.values():
            if run.task and not run.task.done():
                run.task.cancel()

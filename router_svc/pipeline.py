"""The training steps of a run, collected, grouped, trained and recorded: one path for synchronous
AT-GRPO (algorithm.max_staleness N = 0) and asynchronous (N >= 1), where collection runs ahead
while the pools train and every pool steps on its own.

    collector:    for step s: wait until every pool p has trained step s-1-N_p, collect s whole,
                  group it, hand it over          (N = 0: after every pool trained s-1)
    pool p:       for step s: wait for s's samples, train p's part, push; never waits for another
                  pool
    recorder:     when every pool has trained s: the step event, state.json (completed = s)

Why the gate bounds staleness: collection of s starts once pool p holds the weights after step
s-1-N_p (a trainer answers only after its replicas loaded them), and p trains s at the version
after s-1, so no sample of p lags more than N_p versions; a sample that still does (a replica
that came back with old weights) is dropped and its task collected again, before p trains.

Evaluations and checkpoints are barriers: a segment runs the pipeline up to the next step that
has one and drains it (every collected step trained, nothing in flight), so a checkpoint holds
every pool at the same step and nothing half-collected: a resume starts from it at that step,
and the tasks of every later step are the same (step_tasks is a function of the step). A fault
mid-segment keeps what the router holds when the trainers kept their weights (the steps
collected and each pool's progress); otherwise every pool rolls back to the checkpoint
(RunLoop.prepare) and the segment starts over from it.

With run.eval_overlap an evaluation is no barrier: step s's starts once every pool has trained s,
runs beside the collection of the steps after (on the same replicas), and no pool trains s+1
before it has ended, so it sees s's weights only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from atgrpo.contract.rollout import EpisodeEnd, Sample, TaskRef
from atgrpo.errors import FailedPrecondition
from router_svc import events
from router_svc.outcome import check_complete, pool_metrics
from router_svc.steps import StepBatches, batches_for, collect_plan, stale_tasks

if TYPE_CHECKING:
    from router_svc.loop import RunLoop

log = logging.getLogger("atgrpo.router")

# a task whose samples come back too stale this often needs the replicas resynced
RECOLLECT_ATTEMPTS = 3


@dataclass
class Collected:
    """One step's collection, whole: its tasks, samples, episode ends and groups."""

    step: int
    tasks: list[TaskRef]
    samples: list[Sample]
    ends: list[EpisodeEnd]
    batches: StepBatches
    started: float
    seconds: float


@dataclass
class PipelineState:
    """What the router holds between a fault and its recovery: kept when the trainers come back
    with the versions it recorded, dropped otherwise."""

    completed: int
    versions: dict[str, int]
    trained: dict[str, int]  # pool -> last step it trained
    collected: dict[int, Collected] = field(default_factory=dict)
    # step -> pool -> metrics
    results: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # step -> pool -> version
    versions_after: dict[int, dict[str, int]] = field(default_factory=dict)
    evaluated: set[int] = field(default_factory=set)  # steps evaluated mid-segment (eval_overlap)


class Pipeline:
    """Runs the steps of one segment: after loop.ledger.completed, up to `last`."""

    def __init__(self, loop: RunLoop):
        self.loop = loop
        self.cfg = loop.cfg
        self.pool_of = loop.cfg.pool_of  # agent -> pool
        self.state: PipelineState | None = None
        self._changed = asyncio.Condition()
        self._collection_over = False  # the collector collects no further step in this run()
        self._last_record = 0.0
        self._evals: dict[int, asyncio.Task] = {}  # step -> its evaluation (eval_overlap)

    def staleness(self, pool: str) -> int:
        return self.cfg.max_staleness(pool)

    def _fresh_state(self) -> PipelineState:
        loop = self.loop
        state = self.state
        if (
            state is not None
            and state.completed == loop.ledger.completed
            and state.versions == loop.ledger.versions
        ):
            return state  # the trainers kept their weights: go on with what was collected
        return PipelineState(
            loop.ledger.completed,
            dict(loop.ledger.versions),
            dict.fromkeys(loop.clients.trainers, loop.ledger.completed),
        )

    async def run(self, last: int) -> None:
        """Steps loop.ledger.completed+1 .. `last`; returns with all of them recorded (or fewer
        when a stop was requested: the steps already collected are still trained and recorded)."""
        self.state = self._fresh_state()
        self._collection_over = False
        self._last_record = time.perf_counter()
        self._evals = {}
        tasks = [asyncio.create_task(self._collector(last), name="collector")]
        tasks += [
            asyncio.create_task(self._pool(p, last), name=f"pool {p}")
            for p in self.loop.clients.trainers
        ]
        recorder = asyncio.create_task(self._recorder(last), name="recorder")
        try:
            done, _ = await asyncio.wait([*tasks, recorder], return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()  # the first fault, raised for the loop'state recovery
            await recorder
        finally:
            running = [*tasks, recorder, *self._evals.values()]
            for t in running:
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _wait(self, ready) -> None:
        async with self._changed:
            await self._changed.wait_for(ready)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _stopping(self) -> bool:
        return self.loop.stop_requested.is_set()

    def _last_collected(self) -> int:
        state = self.state
        return max([state.completed, *state.collected])

    # ---- the three parts -------------------------------------------------------------------

    async def _collector(self, last: int) -> None:
        state = self.state
        step = self._last_collected() + 1
        while step <= last and not self._stopping():
            await self._wait(
                lambda st=step: (
                    all(state.trained[p] >= st - 1 - self.staleness(p) for p in state.trained)
                    or self._stopping()
                )
            )
            if self._stopping():
                break
            state.collected[step] = await self._collect(step)
            await self._notify()
            step += 1
        self._collection_over = True
        await self._notify()

    async def _collect(self, step: int, tasks: list[TaskRef] | None = None) -> Collected:
        loop, cfg = self.loop, self.cfg
        start = time.perf_counter()
        if tasks is None:
            tasks = await loop.tasks(cfg.env.train_split, step - 1, cfg.run.tasks_per_step)
        # A pool with N = 0 holds still while this collects: every replica must serve its version.
        # The others are not pinned: their replicas load new weights while this collects (one n=K
        # generation runs on one version, so a group never mixes two); each sample says which.
        pinned = {p: v for p, v in self.state.versions.items() if self.staleness(p) == 0}
        samples, ends = await loop.collect(collect_plan(cfg, tasks, step=step, versions=pinned))
        check_complete(ends, len(tasks))
        self._check_not_behind(step, samples)
        return Collected(
            step,
            list(tasks),
            samples,
            ends,
            batches_for(self.cfg, samples),
            start,
            time.perf_counter() - start,
        )

    def _check_not_behind(self, step: int, samples: list[Sample]) -> None:
        """A sample already too stale for the weights its pool holds now comes from a replica that
        missed a push (one restarted with its initial weights): recovery resyncs it first."""
        for pool, version in self.state.versions.items():
            stale = stale_tasks(samples, self.pool_of, pool, version, self.staleness(pool))
            if stale:
                raise FailedPrecondition(
                    f"step {step}: tasks {sorted(stale)[:3]} of pool {pool!r} were sampled more "
                    f"than {self.staleness(pool)} versions behind {version}; the replicas are "
                    "resynced and the step is collected again"
                )

    async def _pool(self, pool: str, last: int) -> None:
        state, loop = self.state, self.loop
        while state.trained[pool] < last:
            step = state.trained[pool] + 1
            await self._wait(lambda st=step: st in state.collected or self._collection_over)
            if step not in state.collected:
                return  # collection stopped before this step
            await self._evaluate_before(step, last)
            samples, dropped = await self._fresh_samples(pool, state.collected[step])
            metrics: dict[str, Any] = {}
            if samples:
                resp = await loop.clients.trainers[pool].train(
                    self.cfg.run.name,
                    step,
                    state.versions[pool],
                    samples,
                    self.cfg.update_for(pool),
                )
                state.versions[pool] = loop.ledger.versions[pool] = resp.version
                metrics = pool_metrics(resp)
            if metrics or dropped:
                state.results.setdefault(step, {})[pool] = {**metrics, "dropped_stale": dropped}
            state.versions_after.setdefault(step, {})[pool] = state.versions[pool]
            state.trained[pool] = step
            await self._notify()

    async def _evaluate_before(self, step: int, last: int) -> None:
        """With run.eval_overlap, step-1's evaluation, if it has one, ends before any pool trains
        `step`: it starts once every pool has trained step-1 and runs beside the collection of
        the steps after (the replicas hold step-1's weights until a pool trains again). The
        segment's last step is evaluated after it (RunLoop.run), as without overlap."""
        due = step - 1
        if not (self.cfg.run.eval_overlap and 0 < due < last and self.loop.eval_due(due)):
            return
        state = self.state
        if due in state.evaluated:
            return
        await self._wait(lambda: all(t >= due for t in state.trained.values()))
        if due not in self._evals:  # the first pool here starts it; the others wait for it too
            self._evals[due] = asyncio.create_task(self.loop.evaluate(due), name=f"eval {due}")
        await asyncio.shield(self._evals[due])
        state.evaluated.add(due)

    async def _fresh_samples(self, pool: str, c: Collected) -> tuple[list, int]:
        """Pool's samples of step c.step, none more than N versions behind its weights now: a task
        with a sample that is goes out (its samples counted as dropped) and is collected again."""
        version, limit, pool_of = self.state.versions[pool], self.staleness(pool), self.pool_of
        samples, batches, dropped = c.samples, c.batches, 0
        for _ in range(RECOLLECT_ATTEMPTS):
            stale = stale_tasks(samples, pool_of, pool, version, limit)
            if not stale:
                return batches.per_pool.get(pool, []), dropped
            dropped += sum(1 for x in samples if x.task_id in stale and pool_of[x.agent] == pool)
            log.warning(
                "step %d: pool %s drops the samples of %d tasks drawn more than %d versions behind "
                "version %d; collecting them again",
                c.step,
                pool,
                len(stale),
                limit,
                version,
            )
            again = await self._collect(c.step, [t for t in c.tasks if t.task_id in stale])
            samples = [x for x in samples if x.task_id not in stale] + again.samples
            batches = batches_for(self.cfg, samples)
        raise FailedPrecondition(
            f"step {c.step}: pool {pool!r} got samples more than {limit} versions behind "
            f"version {version} {RECOLLECT_ATTEMPTS} times; the replicas are resynced"
        )

    async def _recorder(self, last: int) -> None:
        state = self.state
        while state.completed < last:
            step = state.completed + 1
            await self._wait(
                lambda st=step: (
                    all(t >= st for t in state.trained.values())
                    or (self._collection_over and st not in state.collected)
                )
            )
            if step not in state.collected:
                return
            self._record(step)

    def _record(self, step: int) -> None:
        state, loop, cfg = self.state, self.loop, self.cfg
        c = state.collected.pop(step)
        results = state.results.pop(step, {})
        after = state.versions_after.pop(step)
        now = time.perf_counter()
        trained = [r for r in results.values() if "train_seconds" in r]
        sync_s = max((r["push_seconds"] for r in trained), default=0.0)
        event = events.step_event(
            step,
            c.batches,
            c.ends,
            results,
            {
                "rollout_seconds": c.seconds,
                "train_seconds": max((r["train_seconds"] for r in trained), default=0.0),
                "weight_sync_seconds": sync_s,
                "step_seconds": now - max(self._last_record, c.started),
                "time": time.time(),
                "retries": loop.ledger.take_retries(),
                **loop.ledger.take_fleet(),
            },
            cfg.env.turn_order,
        )
        self._last_record = now
        if cfg.run.save_samples:
            loop.ledger.dir.write_samples(
                step, c.samples, c.batches.rewards, c.batches.advantages, self.pool_of
            )
        state.completed = step
        # the versions after this step, not those of pools already ahead
        loop.ledger.complete(step, event, after)

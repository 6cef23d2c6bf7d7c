"""The run loop (DESIGN.md §2): collect, group, train every pool, evaluate, checkpoint, repeat.
The steps between two evaluations or checkpoints run through router_svc.pipeline (one step after
the other, or collection ahead of training with algorithm.max_staleness > 0); evaluations,
checkpoints, set-up and recovery are this loop's.

    for step in resumed+1 .. steps:
        tasks   = step_tasks(seed, step)                        same tasks after a resume
        samples = Collect(tasks) over the replicas there now, by queue (tree sampling, K-way)
        batches = mix rewards, group (task, agent, turn), advantages, filter, route to pools
        Train(batch) on every pool's trainer at once            answers once replicas hold v+1
        every eval_every_steps:       flat rollouts on the eval split
        every checkpoint_every_steps: SaveCheckpoint on every pool, then state.json

A step's samples are used whole or not at all: nothing reaches a trainer before the step's
collection is complete (every episode ended without error), and a step that fails is redone from
its start. After a fault (a service restarting, an episode lost) the loop recovers on its own:
it sets the trainers up again (a restarted trainer loads the last checkpoint, restarted rollout
replicas get the current weights), rolls every pool back to one checkpoint when their versions
no longer agree with a recorded step, and continues after the step they hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atgrpo.config import RunConfig
from atgrpo.contract.rollout import CollectPlan, EpisodeEnd, Sample, TaskRef
from atgrpo.env_check import check_spec, env_options, not_found
from atgrpo.errors import (
    AtgrpoError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from atgrpo.rundir import Checkpoint, Progress, RunDir
from router_svc import events
from router_svc.checkpoints import retained
from router_svc.clients import Clients, pool_spec
from router_svc.dispatch import Dispatch
from router_svc.ledger import Ledger
from router_svc.outcome import StepIncomplete, check_complete
from router_svc.pipeline import Pipeline
from router_svc.steps import collect_plan, step_tasks
from trainer_svc.client import checkpoint_deadline_s

log = logging.getLogger("atgrpo.router")

MAX_ATTEMPTS = 12  # consecutive failed attempts of one step before the run fails


# Faults a run survives by recovering and trying the step again; anything else (a bad config, a
# bug) fails the run at once with its message.
RECOVERABLE = (
    Unavailable,
    ResourceExhausted,
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    Internal,
    StepIncomplete,
)


class RunLoop:
    """One run, driven against running services. `emit` receives every event dict as it happens."""

    def __init__(
        self,
        cfg: RunConfig,
        emit: Callable[[dict[str, Any]], None] = lambda e: None,
        clients: Clients | None = None,
    ):
        self.cfg = cfg
        self.dir = RunDir(cfg.run.run_dir)
        self.clients = clients or Clients.connect(cfg)
        self.emit = emit
        self.ledger = Ledger(cfg.run.name, self.dir, emit)  # shared with the pipeline
        self.resumed_from = 0
        self.stop_requested = asyncio.Event()
        self._task_ids: dict[str, list[str] | None] = {}
        self._checkpoint_bytes: dict[str, int] = {}  # pool -> about one checkpoint's size
        self._last_eval: tuple[int, float] | None = None  # (step, success rate)
        self._failures = 0
        self._failed_at = -1  # self.ledger.completed at the last fault
        self.pipeline = Pipeline(self)

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self) -> str:
        """After prepare(): train to the configured step count, or until stop is requested.
        Returns 'finished' or 'stopped'."""
        cfg = self.cfg
        every = cfg.run.checkpoint_every_steps
        if self.ledger.completed == 0:
            # Without it a lost trainer sends the run back to the start from model_path: the same
            # weights, without writing a checkpoint of them (115 GB for a full Qwen3-8B).
            if cfg.run.checkpoint_at_start and not self._checkpoint_at(0):
                await self._guarded(self.checkpoint, 0)
            if cfg.run.eval_every_steps:
                await self._guarded(self.evaluate, 0)  # the baseline the curves start from
        while True:
            while self.ledger.completed < cfg.run.steps and not self.stop_requested.is_set():
                # up to the next evaluation or checkpoint (collecting ahead of training when
                # max_staleness allows it)
                ran = await self._guarded(self.pipeline.run, self._segment_end())
                step = self.ledger.completed
                if not ran:
                    continue  # recovered: the loop goes on from self.ledger.completed
                if self.eval_due(step) and not self._evaluated(step):
                    await self._guarded(self.evaluate, step)
                if every and step % every == 0:
                    await self._guarded(self.checkpoint, step)
            # A stopped run keeps its last step, so a restart continues right after it.
            if self._checkpoint_at(self.ledger.completed):
                return "finished" if self.ledger.completed >= cfg.run.steps else "stopped"
            await self._guarded(self.checkpoint, self.ledger.completed)

    def _segment_end(self) -> int:
        """The next step after the last completed one with an evaluation or a checkpoint, or the
        last step: the pipeline drains there."""
        run = self.cfg.run
        evals = 0 if run.eval_overlap else run.eval_every_steps  # else the pipeline evaluates
        every = [n for n in (evals, run.checkpoint_every_steps) if n]
        return min([run.steps] + [(self.ledger.completed // n + 1) * n for n in every])

    async def _guarded(self, fn, step: int) -> bool:
        """fn(step); after a recoverable fault, recover and return False (the caller redoes its
        work from self.ledger.completed). Fails the run after MAX_ATTEMPTS faults in a row."""
        for _ in range(MAX_ATTEMPTS):
            try:
                await fn(step)
                self._failures = 0
                return True
            except RECOVERABLE as err:
                # in a row = with no step recorded between them: a segment runs many steps, and
                # a fault each hundred steps (a replica scaled down) must not add up to a failure
                if self.ledger.completed != self._failed_at:
                    self._failures, self._failed_at = 0, self.ledger.completed
                self._failures += 1
                self.ledger.retries += 1
                if self._failures >= MAX_ATTEMPTS:
                    raise
                delay = min(10.0, 0.25 * 2**self._failures)  # faults in a row back off further
                log.warning(
                    "step %d: %s: %s; recovering in %.1fs (attempt %d of %d)",
                    step,
                    type(err).__name__,
                    err,
                    delay,
                    self._failures,
                    MAX_ATTEMPTS,
                )
                await asyncio.sleep(delay)
                try:
                    await self.prepare()
                except RECOVERABLE as again:
                    log.warning("recovery not possible yet: %s", again)
                    continue
                return False
        return False

    async def check_env(self) -> None:
        """The env's spec under the run's options agrees with the config, or the run fails now with
        what to change (not after a dozen retries of episodes that cannot finish)."""
        env = self.cfg.env
        try:
            spec = await self.clients.env.describe(env.name, env_options(self.cfg))
        except NotFound as err:  # no such env there: no retry will change that
            raise not_found(err, env) from None
        check_spec(env, spec)  # the same check, and message, as `atgrpo config check`

    async def prepare(self) -> None:
        """Set up every trainer, resuming from the run directory when it holds progress."""
        await self.check_env()
        progress = self.dir.read_progress()
        if progress is not None and progress.run != self.cfg.run.name:
            raise FailedPrecondition(
                f"{self.dir.path} holds run {progress.run!r}, not {self.cfg.run.name!r}: "
                "give this run its own run_dir"
            )
        ckpt = progress.checkpoint if progress else None
        self.ledger.checkpoints = list(progress.checkpoints) if progress else []
        # A step's event is written before state.json counts it: one past it was never completed.
        recorded = max(
            [
                progress.completed_step if progress else 0,
                *(e["step"] for e in self.dir.read_events() if e["kind"] == "step"),
            ]
        )
        self.dir.write_config(self.cfg)
        root = str(self.dir.path / "checkpoints")
        # Pools may be past the recorded step (a fault between an update and its record, or
        # collection running ahead); when the trainers come back with the versions this router
        # gave them, the run goes on from what it holds (Pipeline).
        live = dict(self.ledger.versions)
        await self._setup_trainers(root, ckpt)
        held, behind = dict(self.ledger.versions), []
        try:
            self.ledger.completed = self._resume_point(progress, live)
        except FailedPrecondition:
            # Some trainer restarted from the checkpoint (before the first one: from model_path, at
            # version 0) while others went on: all go back to it.
            back = ckpt or Checkpoint(0, {}, dict.fromkeys(self.clients.trainers, 0))
            behind = [
                p for p in self.clients.trainers if self.ledger.versions[p] != back.versions.get(p)
            ]
            log.warning(
                "pools %s roll back to the %s",
                behind,
                f"checkpoint of step {ckpt.step}"
                if ckpt
                else "starting weights (no checkpoint yet)",
            )
            await self._setup_trainers(root, ckpt, reload=behind)
            self.ledger.completed = self._resume_point(progress)
        self.resumed_from = self.ledger.completed
        self.dir.truncate_events(self.ledger.completed)
        if self._last_eval and self._last_eval[0] > self.ledger.completed:
            self._last_eval = None  # its event went with the undone steps: evaluate it again
        rollback = events.rollback_event(
            recorded,
            self.ledger.completed,
            self.dir.checkpoint_dir(ckpt.step).name if ckpt else "start",
            progress.versions if progress else {},
            held,
            behind,
            progress.completed_step if progress else 0,
        )
        if rollback:
            # The run is at the checkpoint now: a recovery that prepares again continues from it
            # rather than recording the same rollback once more.
            self.ledger.write_progress()
            # Said where the user looks (the console, metrics.jsonl, TensorBoard), not only here.
            log.warning(
                "rolled back from step %d to step %d: %s",
                rollback["from_step"],
                self.ledger.completed,
                rollback["reason"],
            )
            self.ledger.record(rollback)
        elif self.ledger.completed:
            log.info("resuming %s after step %d", self.cfg.run.name, self.ledger.completed)

    async def _setup_trainers(
        self, root: str, ckpt: Checkpoint | None, reload: list[str] | None = None
    ) -> None:
        """`reload`: these pools go back to `ckpt` (None: to the model at model_path) even when
        their trainers kept running. Loading a checkpoint gets as long as saving it would."""
        pools = reload if reload is not None else list(self.clients.trainers)
        listed = await self.clients.rollout.listed()
        infos = await asyncio.gather(
            *(
                self.clients.trainers[p].setup(
                    pool_spec(self.cfg, p, root, listed[p]),
                    resume_from=ckpt.paths.get(p, "") if ckpt else "",
                    reload=reload is not None,
                    timeout_s=checkpoint_deadline_s(ckpt.nbytes.get(p, 0) if ckpt else 0),
                )
                for p in pools
            )
        )
        for p, info in zip(pools, infos, strict=True):
            self.clients.rollout.synced(p, listed[p], info.rollout_addresses)
        self.ledger.versions.update({p: info.version for p, info in zip(pools, infos, strict=True)})
        self._checkpoint_bytes.update(
            {p: info.checkpoint_bytes for p, info in zip(pools, infos, strict=True)}
        )

    async def evaluate_checkpoint(self, where: Path | None) -> str:
        """An evaluation run: every trainer set up from `where`/<pool> (None: from its model_path),
        which pushes those weights to the rollout replicas; one evaluation, nothing trained.
        Returns 'finished'."""
        await self.check_env()
        listed = await self.clients.rollout.listed()
        pools = list(self.clients.trainers)
        infos = await asyncio.gather(
            *(
                self.clients.trainers[p].setup(
                    pool_spec(self.cfg, p, "", listed[p]),
                    resume_from=str(where / p) if where else "",
                )
                for p in pools
            )
        )
        for p, info in zip(pools, infos, strict=True):
            self.clients.rollout.synced(p, listed[p], info.rollout_addresses)
        step = where.name.removeprefix("step-") if where else "0"
        await self.evaluate(int(step) if step.isdigit() else 0)
        return "finished"

    def _resume_point(self, progress: Progress | None, live: dict[str, int] | None = None) -> int:
        """The last step whose pool versions the trainers now hold: the last completed step when the
        trainers kept running (`live`: the versions this router last saw them at), the last
        checkpoint's step when they were restarted from it."""
        if progress is None:
            # trained a step the router never counted: back to the start
            if any(self.ledger.versions.values()):
                raise FailedPrecondition(
                    f"the trainers hold versions {self.ledger.versions}, but {self.dir.path} "
                    "records no completed step"
                )
            return 0
        if progress.versions == self.ledger.versions or (live and live == self.ledger.versions):
            return progress.completed_step
        ckpt = progress.checkpoint
        if ckpt and ckpt.versions == self.ledger.versions:
            return ckpt.step
        if ckpt is None and not any(self.ledger.versions.values()):
            return 0  # no checkpoint yet, and every trainer holds the starting weights
        raise FailedPrecondition(
            f"the trainers hold versions {self.ledger.versions}, but {self.dir.path} records "
            f"{progress.versions} after step {progress.completed_step}"
            + (f" and {ckpt.versions} at step {ckpt.step}" if ckpt else "")
            + ": restart the trainers so they load the last checkpoint"
        )

    # ---- collection --------------------------------------------------------------------------

    async def tasks(
        self, split: str, index: int, count: int, *, distinct: bool = False
    ) -> list[TaskRef]:
        """`distinct`: at most each task of a finite list once (evaluation: a repeat adds
        nothing)."""
        if split not in self._task_ids:
            self._task_ids[split] = await self._list_tasks(split)
        ids = self._task_ids[split]
        if distinct and ids is not None and count > len(ids):
            log.info(
                "the %s split has %d tasks; evaluating each once, not %d episodes",
                split,
                len(ids),
                count,
            )
            count = len(ids)
        return step_tasks(self.cfg.run.seed, index, count, split, ids)

    async def _list_tasks(self, split: str) -> list[str] | None:
        env, options = self.cfg.env.name, env_options(self.cfg)
        ids, total = await self.clients.env.list_tasks(env, split, options=options)
        if total < 0:
            return None  # generated from seeds: unbounded
        while len(ids) < total:
            more, _ = await self.clients.env.list_tasks(
                env, split, offset=len(ids), limit=10_000, options=options
            )
            if not more:
                break
            ids += more
        return ids

    async def collect(self, plan: CollectPlan) -> tuple[list[Sample], list[EpisodeEnd]]:
        """One plan over the replicas that serve the run's weights now (those that joined are
        synced first); returns when every task has ended, its tasks collected again elsewhere
        when a replica is lost on the way (router_svc.dispatch)."""
        fleet = self.clients.rollout
        replicas = await fleet.refresh(self._sync_pool)
        dispatch = Dispatch(
            plan, replicas, lambda a, part: fleet.client(a).collect(part), fleet.lost
        )
        samples, ends = await dispatch.run()
        self.ledger.observe_collect(replicas, dispatch.requeued)
        return samples, ends

    async def _sync_pool(self, pool: str, replicas: list[str]) -> list[str]:
        """Give pool's trainer its replicas now: it pushes its weights to those that joined and
        answers with those that hold them. Never sets a trainer up: one that restarted refuses
        (FAILED_PRECONDITION), and the loop's recovery restores it from the checkpoint."""
        info = await self.clients.trainers[pool].setup(
            pool_spec(self.cfg, pool, str(self.dir.path / "checkpoints"), replicas),
            replicas_only=True,
        )
        return list(info.rollout_addresses)

    # ---- evaluation and checkpoints ----------------------------------------------------------

    def eval_due(self, step: int) -> bool:
        every = self.cfg.run.eval_every_steps
        return bool(every) and (step % every == 0 or step == self.cfg.run.steps)

    def _evaluated(self, step: int) -> bool:
        """The pipeline evaluated `step` already (run.eval_overlap; a stop ended its segment)."""
        return self._last_eval is not None and self._last_eval[0] == step

    async def evaluate(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        start = time.perf_counter()
        # the same every time
        tasks = await self.tasks(cfg.env.eval_split, 0, cfg.run.eval_tasks, distinct=True)
        samples, ends = await self.collect(
            collect_plan(cfg, tasks, step=step, eval_mode=True, versions=self.ledger.versions)
        )
        check_complete(ends, len(tasks))
        # an evaluation trains nothing: its reward is the local one, no advantage
        if cfg.run.save_eval_samples:
            self.dir.write_samples(
                step,
                samples,
                [s.local_reward for s in samples],
                [None] * len(samples),
                cfg.pool_of,
                folder="eval-samples",
            )
        event = {
            **events.eval_event(step, ends, cfg.env.turn_order),
            "eval_seconds": time.perf_counter() - start,
            "time": time.time(),
        }
        self._last_eval = (step, event["success_rate"])
        self.ledger.record(event)
        return event

    async def checkpoint(self, step: int) -> Checkpoint:
        where = self.dir.checkpoint_dir(step)
        pools = list(self.clients.trainers)
        saved = await asyncio.gather(
            *(
                self.clients.trainers[p].save_checkpoint(
                    str(where / p), nbytes=self._checkpoint_bytes.get(p, 0)
                )
                for p in pools
            )
        )
        evaluated = self._last_eval[1] if self._last_eval and self._last_eval[0] == step else None
        ckpt = Checkpoint(
            step,
            {p: s.path for p, s in zip(pools, saved, strict=True)},
            {p: s.version for p, s in zip(pools, saved, strict=True)},
            evaluated,
            {p: self._checkpoint_bytes.get(p, 0) for p in pools},
        )
        self.ledger.checkpoints = [c for c in self.ledger.checkpoints if c.step != step] + [ckpt]
        self.ledger.write_progress()  # complete and recorded before any older one is deleted
        await self._prune()
        return ckpt

    async def _prune(self) -> None:
        """Delete the checkpoints run.keep_checkpoints no longer keeps. state.json lists each until
        its folders are gone, so one whose delete failed (or was cut short) is tried again after
        the next checkpoint; a failed delete never fails the run."""
        keep = retained(self.ledger.checkpoints, self.cfg.run.keep_checkpoints)
        for old in [c for c in self.ledger.checkpoints if c not in keep]:
            try:
                await asyncio.gather(
                    *(
                        self.clients.trainers[p].delete_checkpoint(path, old.nbytes.get(p, 0))
                        for p, path in old.paths.items()
                        if p in self.clients.trainers
                    )
                )
            except AtgrpoError as err:
                log.warning(
                    "could not delete the checkpoint of step %d (%s): %s; it stays listed in "
                    "state.json and is tried again after the next checkpoint",
                    old.step,
                    type(err).__name__,
                    err,
                )
                continue
            self.ledger.checkpoints.remove(old)
            self.ledger.write_progress()

    def _checkpoint_at(self, step: int) -> bool:
        return bool(self.ledger.checkpoints) and self.ledger.checkpoints[-1].step == step

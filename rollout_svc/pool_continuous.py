"""A pool's worker over a continuous batch (rollout_svc.engines.hf_batch), for an engine that has
one (`engine.batcher()`, and `engine.continuous` on).

A request goes into the batch as soon as it arrives, not after the batch running now: its rows
join the decode once its prompt is prefilled, and it is answered as soon as its own rows end. The
pool's contract stays what it was (rollout_svc.pool):

- a weight swap waits until every request taken before it has ended (no request mixes two
  versions, each is tagged with the version it ran on), and requests behind it wait for it;
- each request's timing is its share of the steps that served it: the seconds of its own
  prefill, and of each decode step a share by its rows in it;
- a request that fails is answered as a fixed batch would answer it (classify): out of memory
  runs it again through the fixed-batch path, which splits it where it must; a request whose
  caller is gone leaves the batch before the next step, and the others go on.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from atgrpo.contract.rollout import Generation, PolicyRef
from atgrpo.errors import AtgrpoError, Internal
from rollout_svc import metrics
from rollout_svc.pool import OUT_OF_MEMORY, _free_memory, _Piece, _Swap, classify

log = logging.getLogger(__name__)


class ContinuousWorker:
    def __init__(self, pool: Any):
        self.pool = pool
        self.batch = pool.engine.batcher()
        self.jobs: dict[int, tuple[Any, PolicyRef]] = {}  # key: (_Request, its version)
        self.swap = None  # a swap taken from the queue, waiting for the batch to empty
        self._keys = 0

    async def run(self) -> None:
        pool = self.pool
        while True:
            self._take_arrived()
            if self.swap is not None and self.batch.idle:
                job, self.swap = self.swap, None
                with pool._busy():
                    await pool._finish(job.future, pool._apply_swap(job))
                continue
            await self._drop_cancelled()
            if self.batch.idle:
                self._take(await pool._queue.get())
                continue
            await self._step()

    def _take_arrived(self) -> None:
        """Everything queued, up to a swap: what comes after one waits for it."""
        while self.swap is None and not self.pool._queue.empty():
            self._take(self.pool._queue.get_nowait())

    def _take(self, item: Any) -> None:
        pool = self.pool
        if isinstance(item, _Swap):
            self.swap = item
            return
        pool.waiting -= 1
        if item.future.done():  # its caller left while it was queued
            return
        key, self._keys = self._keys, self._keys + 1
        self.jobs[key] = (item, PolicyRef(pool.name, item.adapter, pool.versions[item.adapter]))
        self.batch.add(key, item.prompt, item.n, item.sampling, item.adapter)
        pool.running = len(self.jobs)

    async def _drop_cancelled(self) -> None:
        gone = [key for key, (req, _) in self.jobs.items() if req.future.done()]
        for key in gone:
            del self.jobs[key]
        if gone:
            await self.pool._thread.run(lambda: [self.batch.cancel(k) for k in gone])
        self.pool.running = len(self.jobs)

    async def _step(self) -> None:
        pool = self.pool
        try:
            with pool._busy():
                outcomes = await pool._thread.run(self.batch.step)
        except Exception as err:  # noqa: BLE001 - a bug in the batch: fail its requests, go on
            log.exception("pool %s: a continuous batch step failed", pool.name)
            error = Internal(f"pool {pool.name!r} failed generating: {err!r}")
            outcomes = [(key, error) for key in self.jobs]
            self.batch = pool.engine.batcher()
        else:
            outcomes = [(o.key, self._accounted(o)) for o in outcomes]
        for key, result in outcomes:
            if (entry := self.jobs.pop(key, None)) is not None:
                await self._answer(*entry, result)
        pool.running = len(self.jobs)

    def _accounted(self, outcome: Any) -> Any:
        """The outcome's completions, its timing added to its request's; or its exception."""
        if isinstance(outcome.result, BaseException):
            return outcome.result
        entry = self.jobs.get(outcome.key)
        if entry is not None:
            t = outcome.timing
            pre, dec = t.get("prefill_s", 0.0), t.get("decode_s", 0.0)
            decoded = sum(len(c.token_ids) for c in outcome.result)
            self.pool.add_timing(entry[0].timing, pre, dec, len(entry[0].prompt), decoded)
            metrics.observe_batch(self.pool.name, [outcome.result], pre + dec)
        return outcome.result

    async def _answer(self, req: Any, policy: PolicyRef, result: Any) -> None:
        if isinstance(result, BaseException):
            result = await self._failed(req, result)
        if req.future.done():
            return
        if isinstance(result, Exception):
            metrics.count_failed(self.pool.name, type(result).__name__)
            req.future.set_exception(copy.copy(result))
        else:
            req.future.set_result(Generation(req.prompt, result, policy, timing=req.timing))

    async def _failed(self, req: Any, err: BaseException) -> Any:
        """What a request that failed in the batch is answered: as a fixed batch of it alone."""
        pool = self.pool
        if isinstance(err, AtgrpoError):
            return err
        kind = classify(err, pool.engine)
        piece = _Piece(req, req.n)
        if kind == OUT_OF_MEMORY:  # run again alone, in smaller pieces where it must
            await pool._thread.run(_free_memory)
            return (await pool._generate([piece], req.adapter, req.sampling))[0]
        error = pool._error(kind, err, [piece], req.sampling)
        log.warning("pool %s: %s", pool.name, error.message, exc_info=err)
        return error

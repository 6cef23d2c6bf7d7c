"""A model pool on one rollout replica: its engine, its versions, and a queue that batches
concurrent generations and orders weight swaps between them.

Every generation and every swap goes through one worker, so a swap happens between batches:
a generation in flight finishes on the old weights and is tagged with the old version, and no
batch mixes two versions (rollout issue). Concurrent requests with the same adapter and sampling
settings are run as one batch, which is what makes n=K tree sampling of many tasks fast.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from atgrpo.contract.rollout import Completion, Generation, PolicyRef
from atgrpo.contract.sampling import Sampling
from atgrpo.errors import FailedPrecondition, InvalidArgument, NotFound
from rollout_svc import metrics

MAX_BATCH_ROWS = 256
# After the first request of a batch, wait for others that are on their way: the requests of one
# Collect step arrive as a burst, each a few hundred microseconds after the last (an env RPC and
# a render apiece). Waiting until the burst pauses for BATCH_GAP_S (at most BATCH_MAX_WAIT_S)
# catches all of it, where a fixed 5 ms split a step's 16 tasks into 1.5 batches on average;
# one bigger batch is worth far more than the wait. A lone request waits one gap.
BATCH_GAP_S = 0.002
BATCH_MAX_WAIT_S = 0.02


@dataclass
class _Request:
    adapter: str
    sampling: Sampling
    prompt: list[int]
    n: int
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _Swap:
    adapter: str
    version: int
    apply: Any                     # callable run in the worker thread
    rollback: bool = False
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class PoolRuntime:
    def __init__(self, name: str, engine: Any, *, lora: bool = False):
        self.name, self.engine, self.lora = name, engine, lora
        self.versions: dict[str, int] = {"": 0}         # "" = base model; adapters by agent name
        self._queue: asyncio.Queue = asyncio.Queue()
        self._worker: asyncio.Task | None = None
        metrics.set_versions(name, self.versions)

    def policies(self) -> list[PolicyRef]:
        return [PolicyRef(self.name, a, v) for a, v in sorted(self.versions.items())]

    def version(self, adapter: str) -> int:
        if adapter not in self.versions:
            raise NotFound(f"pool {self.name!r} serves no adapter {adapter!r}; it has "
                           f"{sorted(a for a in self.versions if a) or 'none'} (load one with LoadWeights)")
        return self.versions[adapter]

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def generate(self, adapter: str, prompt: list[int], sampling: Sampling, n: int) -> Generation:
        self.version(adapter)   # unknown adapters fail now, not inside a batch
        req = _Request(adapter, sampling, prompt, n)
        self._ensure_worker()
        await self._queue.put(req)
        return await req.future

    async def swap(self, adapter: str, version: int, apply, *, rollback: bool = False) -> None:
        """Run `apply()` (which loads new weights into the engine) between batches, then set the
        version. Versions only go up, but for a rollback (a trainer restored from a checkpoint,
        whose weights are then the run's)."""
        job = _Swap(adapter, version, apply, rollback)
        self._ensure_worker()
        await self._queue.put(job)
        await job.future

    async def _apply_swap(self, job: _Swap) -> None:
        # Checked here, in queue order, so two concurrent pushes cannot both pass.
        current = self.versions.get(job.adapter, -1)
        if job.version <= current and not job.rollback:
            what = f"adapter {job.adapter!r}" if job.adapter else "model"
            raise FailedPrecondition(f"pool {self.name!r} {what} is at version {current}; version "
                                     f"{job.version} is stale. Push a newer version")
        await asyncio.to_thread(job.apply)
        self.versions[job.adapter] = job.version
        metrics.set_versions(self.name, self.versions)

    def _take_batch(self, first: _Request) -> list[_Request]:
        """`first` plus queued requests it can share a batch with (same adapter and sampling)."""
        batch, rest, rows = [first], [], first.n
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if (isinstance(item, _Request) and item.adapter == first.adapter and item.sampling == first.sampling
                    and rows + item.n <= MAX_BATCH_ROWS and not rest):
                batch.append(item)
                rows += item.n
            else:
                rest.append(item)   # keeps its place: anything after a swap waits for the swap
        for item in rest:
            self._queue.put_nowait(item)
        return batch

    async def _await_burst(self) -> None:
        loop = asyncio.get_running_loop()
        deadline, seen = loop.time() + BATCH_MAX_WAIT_S, -1
        while self._queue.qsize() != seen and loop.time() < deadline and self._queue.qsize() < MAX_BATCH_ROWS:
            seen = self._queue.qsize()
            await asyncio.sleep(BATCH_GAP_S)

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, _Swap):
                await self._finish(item.future, self._apply_swap(item))
                continue
            await self._await_burst()
            batch = self._take_batch(item)
            policy = PolicyRef(self.name, item.adapter, self.versions[item.adapter])
            work = asyncio.to_thread(self.engine.generate, [r.prompt for r in batch], [r.n for r in batch],
                                     item.sampling, item.adapter)
            start = time.perf_counter()
            try:
                outs: list[list[Completion]] = await work
            except Exception as err:  # noqa: BLE001 - fail the requests, keep serving
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(InvalidArgument(f"generation failed: {err}"))
                continue
            metrics.observe_batch(self.name, outs, time.perf_counter() - start)
            for r, completions in zip(batch, outs, strict=True):
                if not r.future.done():
                    r.future.set_result(Generation(r.prompt, completions, policy))

    @staticmethod
    async def _finish(future: asyncio.Future, work) -> None:
        try:
            result = await work
        except Exception as err:  # noqa: BLE001 - the caller gets it; the pool keeps serving
            future.set_exception(err)
        else:
            future.set_result(result)

"""A model pool on one rollout replica: its engine, its versions, and a queue that batches
concurrent generations and orders weight swaps between them. (An engine with a continuous batch,
the hf engine's, is served by rollout_svc.pool_continuous instead of the fixed batches below; the
contract is the same.)

Every generation and every swap goes through one worker, so a swap happens between batches:
a generation in flight finishes on the old weights and is tagged with the old version, and no
batch mixes two versions (rollout issue). Concurrent requests with the same adapter and sampling
settings are run as one batch, which is what makes n=K tree sampling of many tasks fast.

An engine exception is told apart (classify): a bad request fails as INVALID_ARGUMENT, a batch
that runs out of memory is run again in smaller pieces (RESOURCE_EXHAUSTED only when one sample
alone does not fit), and any other engine failure is UNAVAILABLE, for the caller to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import gc
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from atgrpo.contract.rollout import Completion, Generation, PolicyRef
from atgrpo.contract.sampling import Sampling
from atgrpo.errors import (
    AtgrpoError,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from atgrpo.model_thread import ModelThread
from atgrpo.perf import generation_flops
from rollout_svc import metrics
from rollout_svc.weights import Staging

log = logging.getLogger(__name__)

MAX_BATCH_ROWS = 256
# After the first request of a batch, wait for others that are on their way: the requests of one
# Collect step arrive as a burst, each a few hundred microseconds after the last (an env RPC and
# a render apiece). Waiting until the burst pauses for BATCH_GAP_S (at most BATCH_MAX_WAIT_S)
# catches all of it, where a fixed 5 ms split a step's 16 tasks into 1.5 batches on average;
# one bigger batch is worth far more than the wait. A lone request waits one gap.
BATCH_GAP_S = 0.002
BATCH_MAX_WAIT_S = 0.02
# Those are the floor. A request that misses a batch waits for that batch and then runs one of its
# own, so the wait worth paying grows with how long a batch takes: BURST_SHARE of the last one's
# seconds, at most BURST_MAX_S. Measured on SmolLM2 (batches of 20-40 s): the first task's request
# of a step missed the 20 ms window and went alone, a 4-row batch of 96 tokens (under 10 s),
# before the 28 others ran together.
BURST_SHARE = 0.02
BURST_MAX_S = 0.5


def burst_wait(last_batch_s: float) -> tuple[float, float]:
    """(gap, most): a batch waits for more requests until none came for `gap` seconds, at most
    `most` seconds in all, given how long the pool's last batch took."""
    most = min(BURST_MAX_S, max(BATCH_MAX_WAIT_S, BURST_SHARE * last_batch_s))
    return max(BATCH_GAP_S, most / 10), most


# How an engine exception is answered. The question is whether the same request, sent again,
# fails the same way:
# - out of memory: torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class),
#   MemoryError, a RuntimeError that says it is out of memory (older torch, cuBLAS; torch's CPU
# allocator says "can't allocate memory"), or an engine's own `oom_errors`. The batch runs again in
# halves (by requests, then a lone request's n samples
#   in two shares), inside the same worker iteration, so no weight swap comes between the pieces;
#   only a single sample that still does not fit fails, as RESOURCE_EXHAUSTED (retryable);
# - a bad request: ValueError, TypeError, IndexError, KeyError, NotImplementedError (what Python
#   raises for an argument it cannot take: a setting out of range, an adapter the engine lacks, a
#   token id past the vocabulary) or an engine's own `bad_request_errors` (vLLM's client errors,
#   e.g. a prompt over max_model_len). Deterministic: INVALID_ARGUMENT, which the router does not
#   retry. A batch of several requests is bisected first, so only the requests at fault fail;
# - anything else (a RuntimeError from CUDA or a kernel, an engine whose core died, an OSError):
#   the engine failed, not the request: UNAVAILABLE, retried by the caller, on another replica
#   where there is one. Not retried here: the rest of the batch fails at once.
# An AtgrpoError an engine raises travels as it is.
OUT_OF_MEMORY, BAD_REQUEST, ENGINE_FAILURE = "out of memory", "bad request", "engine failure"
_BAD_REQUEST_TYPES = (ValueError, TypeError, IndexError, KeyError, NotImplementedError)
_OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def classify(err: BaseException, engine: Any = None) -> str:
    """OUT_OF_MEMORY, BAD_REQUEST or ENGINE_FAILURE for an exception `engine.generate` raised."""
    if isinstance(
        err, (torch.OutOfMemoryError, MemoryError, *getattr(engine, "oom_errors", ()))
    ) or (isinstance(err, RuntimeError) and any(w in str(err).lower() for w in _OOM_WORDS)):
        return OUT_OF_MEMORY
    if isinstance(err, (*_BAD_REQUEST_TYPES, *getattr(engine, "bad_request_errors", ()))):
        return BAD_REQUEST
    return ENGINE_FAILURE


@dataclass
class _Request:
    adapter: str
    sampling: Sampling
    prompt: list[int]
    n: int
    future: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # its share of the batches that served it
    timing: dict[str, float] = field(default_factory=dict)


@dataclass
class _Piece:
    """Part of a batch: `n` of `request`'s samples, from its sample number `first` on."""

    request: _Request
    n: int
    first: int = 0


@dataclass
class _Swap:
    adapter: str
    version: int
    apply: Any  # callable run in the worker thread
    rollback: bool = False
    future: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class PoolRuntime:
    def __init__(self, name: str, engine: Any, *, lora: bool = False):
        self.name, self.engine, self.lora = name, engine, lora
        self.versions: dict[str, int] = {"": 0}  # "" = base model; adapters by agent name
        self.staging = Staging()  # the memory full pushes arrive in, used again
        self._queue: asyncio.Queue = asyncio.Queue()
        self._worker: asyncio.Task | None = None
        # The engine runs on this one thread, generations and weight swaps alike: on rotating
        # threads each one's freed tensors pile up in another malloc arena (atgrpo.model_thread).
        self._thread = ModelThread(f"pool-{name}")
        self.oom_retries = 0  # batches run again in smaller pieces after running out of memory
        # the engine's seconds on the last batch: how long to wait for company (burst_wait)
        self.last_batch_s = 0.0
        # requests queued / in the batch generating (metrics, read at scrape)
        self.waiting = self.running = 0
        # Wall seconds the worker spent on batches and swaps: those finished, and when the one in
        # progress started. Read at scrape (busy_seconds) from another thread, hence the lock.
        self._busy_lock = threading.Lock()
        self._busy_done, self._busy_since = 0.0, None
        # This process's matmul FLOP/s on the engine's device (atgrpo.perf, measured once when the
        # service starts): what a generation's FLOP/s are held against. 0.0: unknown.
        rate = getattr(engine, "matmul_rate", None)
        self.matmul_rate = float(rate()) if callable(rate) else 0.0
        # An engine with a continuous batch (rollout_svc.pool_continuous) takes each request as
        # it arrives; any other runs one fixed batch at a time. Read on the engine's class, not
        # through a wrapper's attribute forwarding: a wrapper's own generate must still be called.
        self.continuous = bool(getattr(engine, "continuous", False)) and callable(
            getattr(type(engine), "batcher", None)
        )
        metrics.set_versions(name, self.versions)
        metrics.register_pool(name, self)

    def policies(self) -> list[PolicyRef]:
        return [PolicyRef(self.name, a, v) for a, v in sorted(self.versions.items())]

    def version(self, adapter: str) -> int:
        if adapter not in self.versions:
            raise NotFound(
                f"pool {self.name!r} serves no adapter {adapter!r}; it has "
                f"{sorted(a for a in self.versions if a) or 'none'} (load one with LoadWeights)"
            )
        return self.versions[adapter]

    def busy_seconds(self) -> float:
        """Wall seconds spent generating batches and swapping weights so far, the batch or swap in
        progress included up to now: rate() of it is the share of time the engine was busy, and it
        grows during a long batch instead of jumping at its end. Never decreases."""
        with self._busy_lock:
            since = self._busy_since
            return self._busy_done + (time.monotonic() - since if since is not None else 0.0)

    @contextlib.contextmanager
    def _busy(self):
        """Counts the wall time of the block (a batch, its retries included, or a swap)."""
        with self._busy_lock:
            self._busy_since = time.monotonic()
        try:
            yield
        finally:
            with self._busy_lock:
                self._busy_done += time.monotonic() - self._busy_since
                self._busy_since = None

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def generate(
        self, adapter: str, prompt: list[int], sampling: Sampling, n: int
    ) -> Generation:
        self.version(adapter)  # unknown adapters fail now, not inside a batch
        req = _Request(adapter, sampling, prompt, n)
        self._ensure_worker()
        self.waiting += 1
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

    def check_newer(self, adapter: str, version: int, rollback: bool = False) -> None:
        """FAILED_PRECONDITION for a version not newer than the one served (but for a rollback)."""
        current = self.versions.get(adapter, -1)
        if version <= current and not rollback:
            what = f"adapter {adapter!r}" if adapter else "model"
            raise FailedPrecondition(
                f"pool {self.name!r} {what} is at version {current}; version "
                f"{version} is stale. Push a newer version"
            )

    async def _apply_swap(self, job: _Swap) -> None:
        # Checked here, in queue order, so two concurrent pushes cannot both pass.
        self.check_newer(job.adapter, job.version, job.rollback)
        await self._thread.run(job.apply)
        self.versions[job.adapter] = job.version
        metrics.set_versions(self.name, self.versions)

    def _take_batch(self, first: _Request) -> list[_Request]:
        """`first` plus queued requests it can share a batch with (same adapter and sampling)."""
        batch, rest, rows = [first], [], first.n
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if (
                isinstance(item, _Request)
                and item.adapter == first.adapter
                and item.sampling == first.sampling
                and rows + item.n <= MAX_BATCH_ROWS
                and not rest
            ):
                batch.append(item)
                rows += item.n
            else:
                rest.append(item)  # keeps its place: anything after a swap waits for the swap
        for item in rest:
            self._queue.put_nowait(item)
        return batch

    async def _await_burst(self) -> None:
        loop = asyncio.get_running_loop()
        gap, most = burst_wait(self.last_batch_s)
        deadline, seen = loop.time() + most, -1
        while (
            self._queue.qsize() != seen
            and loop.time() < deadline
            and self._queue.qsize() < MAX_BATCH_ROWS
        ):
            seen = self._queue.qsize()
            await asyncio.sleep(gap)

    async def _run(self) -> None:
        if self.continuous:
            from rollout_svc.pool_continuous import ContinuousWorker

            await ContinuousWorker(self).run()
            return
        while True:
            item = await self._queue.get()
            if isinstance(item, _Swap):
                with self._busy():
                    await self._finish(item.future, self._apply_swap(item))
                continue
            await self._await_burst()
            batch = self._take_batch(item)
            self.waiting, self.running = self.waiting - len(batch), len(batch)
            policy = PolicyRef(self.name, item.adapter, self.versions[item.adapter])
            try:
                with self._busy():
                    outcomes = await self._generate(
                        [_Piece(r, r.n) for r in batch], item.adapter, item.sampling
                    )
            except Exception as err:  # noqa: BLE001 - a bug here: fail the requests, keep serving
                log.exception("pool %s: generating a batch failed", self.name)
                outcomes = [Internal(f"pool {self.name!r} failed generating: {err!r}")] * len(batch)
            self.running = 0
            for r, outcome in zip(batch, outcomes, strict=True):
                if r.future.done():
                    continue
                if isinstance(outcome, Exception):
                    metrics.count_failed(self.name, type(outcome).__name__)
                    r.future.set_exception(copy.copy(outcome))  # one instance per request raised
                else:
                    r.future.set_result(Generation(r.prompt, outcome, policy, timing=r.timing))

    async def _generate(
        self, pieces: list[_Piece], adapter: str, sampling: Sampling
    ) -> list[list[Completion] | AtgrpoError]:
        """Each piece's completions, or the error it fails with (see classify). The retries run
        here, inside one worker iteration: no swap comes between the pieces of a batch."""
        sp = sampling
        if pieces[0].first and sp.seed is not None:  # a later share of one request's samples
            # draws its own, not the same again
            sp = dataclasses.replace(sp, seed=sp.seed + pieces[0].first)
        start = time.perf_counter()
        try:
            outs = await self._thread.run(
                self.engine.generate,
                [p.request.prompt for p in pieces],
                [p.n for p in pieces],
                sp,
                adapter,
            )
            if [len(o) for o in outs] != [p.n for p in pieces]:
                raise RuntimeError(
                    f"the engine answered {[len(o) for o in outs]} completions for "
                    f"{[p.n for p in pieces]} asked"
                )
        except AtgrpoError as err:
            return [err] * len(pieces)
        except Exception as err:  # noqa: BLE001 - told apart below; the pool keeps serving
            kind = classify(err, self.engine)
            error = self._error(kind, err, pieces, sp)
            if kind == ENGINE_FAILURE or (kind == BAD_REQUEST and len(pieces) == 1):
                log.warning("pool %s: %s", self.name, error.message, exc_info=err)
        else:
            seconds = time.perf_counter() - start
            self.last_batch_s = seconds
            metrics.observe_batch(self.name, outs, seconds)
            self._account(pieces, outs, seconds)
            return outs
        # Out of the except block, the exception's traceback (and the tensors its frames hold) is
        # gone before a retry.
        if kind == OUT_OF_MEMORY and (len(pieces) > 1 or pieces[0].n > 1):
            self.oom_retries += 1
            metrics.count_oom_retry(self.name)
            log.warning(
                "pool %s: out of memory on %d requests (%d samples); running them again in two "
                "pieces",
                self.name,
                len(pieces),
                sum(p.n for p in pieces),
            )
            await self._thread.run(_free_memory)
        elif kind != BAD_REQUEST or len(pieces) == 1:
            return [error] * len(pieces)
        if len(pieces) == 1:  # one request's samples in two shares, their completions joined
            p = pieces[0]
            half = p.n // 2
            out = []
            for share in (
                _Piece(p.request, half, p.first),
                _Piece(p.request, p.n - half, p.first + half),
            ):
                done = (await self._generate([share], adapter, sampling))[0]
                if isinstance(done, AtgrpoError):
                    return [done]
                out += done
            return [out]
        half = len(pieces) // 2
        first = await self._generate(pieces[:half], adapter, sampling)
        broken = next((o for o in first if isinstance(o, Unavailable)), None)
        if broken is not None:  # the engine failed: the rest would fail too
            return first + [broken] * (len(pieces) - half)
        return first + await self._generate(pieces[half:], adapter, sampling)

    def _account(self, pieces: list[_Piece], outs: list[list[Completion]], seconds: float) -> None:
        """Add each request's share of one engine batch to its timing (Generation.timing): the
        batch's prefill seconds shared by prompt tokens and the rest of its `seconds` (decode) by
        decoded tokens, its tokens, model FLOPs and the FLOPs the matmul rate would have done in
        its seconds (gen_matmul_flops: the MFU's denominator). An engine that does not split
        prefill from decode (no `last_timing`: vLLM) has all of it counted as decode."""
        prefill_s = min(
            max((getattr(self.engine, "last_timing", None) or {}).get("prefill_s", 0.0), 0.0),
            seconds,
        )
        decode_s = seconds - prefill_s
        prompt = [len(p.request.prompt) for p in pieces]
        decoded = [sum(len(c.token_ids) for c in out) for out in outs]
        rows = sum(p.n for p in pieces)
        for p, prompt_tokens, decode_tokens in zip(pieces, prompt, decoded, strict=True):
            pre = prefill_s * prompt_tokens / max(sum(prompt), 1)
            dec = decode_s * (decode_tokens / sum(decoded) if sum(decoded) else p.n / rows)
            self.add_timing(p.request.timing, pre, dec, prompt_tokens, decode_tokens)

    def add_timing(
        self, timing: dict[str, float], pre: float, dec: float, prompt: int, decoded: int
    ) -> None:
        """Add to a request's timing its prefill and decode seconds and tokens, its model FLOPs
        and what the matmul rate would have done in its seconds (gen_matmul_flops)."""
        size = getattr(self.engine, "model_size", None)
        add = {
            "prefill_s": pre,
            "decode_s": dec,
            "prefill_tokens": float(prompt),
            "decode_tokens": float(decoded),
            "gen_flops": generation_flops(size, 1, prompt, decoded) if size else 0.0,
            "gen_matmul_flops": (pre + dec) * self.matmul_rate,
        }
        for k, v in add.items():
            timing[k] = timing.get(k, 0.0) + v

    def _error(
        self, kind: str, err: BaseException, pieces: list[_Piece], sampling: Sampling
    ) -> AtgrpoError:
        what = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        if kind == OUT_OF_MEMORY:
            p = pieces[0]  # the error is final only for one sample of one request
            return ResourceExhausted(
                f"pool {self.name!r} ran out of memory generating one sample of a "
                f"{len(p.request.prompt)}-token prompt with max_tokens {sampling.max_tokens}, "
                f"even alone ({what}). Retryable (memory may be free "
                "later, or on another replica); to need less, lower sampling.max_tokens, the "
                "tree's k (samples per prompt) or sampling.max_prompt_tokens"
            )
        if kind == BAD_REQUEST:
            return InvalidArgument(
                f"generation failed on a bad request ({what}); sent again, it fails the same way"
            )
        return Unavailable(
            f"the engine of pool {self.name!r} failed: {what}; retry, possibly on another replica"
        )

    @staticmethod
    async def _finish(future: asyncio.Future, work) -> None:
        try:
            result = await work
        except Exception as err:  # noqa: BLE001 - the caller gets it; the pool keeps serving
            future.set_exception(err)
        else:
            future.set_result(result)


def _free_memory() -> None:
    """After an out-of-memory: collect what the failed attempt left and hand cached GPU blocks
    back."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()

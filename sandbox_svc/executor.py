"""Admission, worker slots and test runs: the sandbox's logic, free of gRPC.

At most `workers` programs run at once, each in its own slot (a uid, a warm container); at most
`queue` more wait. Past that, ResourceExhausted with a retry hint: a flood is shed at the door,
and everything admitted runs to completion.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import queue as queue_mod
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from atgrpo.contract.sandbox import CaseResult, ExecRequest, ExecResult, TestsRequest, TestsResult
from atgrpo.errors import DeadlineExceeded, ResourceExhausted
from sandbox_svc.backends.base import Backend
from sandbox_svc.compare import outputs_match
from sandbox_svc.metrics import EXEC_SECONDS, QUEUE_DEPTH, REJECTED, RUNNING, set_capacity
from sandbox_svc.policy import Policy, check_exec, check_tests


def _fit_deadline(req: ExecRequest, deadline: float | None) -> ExecRequest:
    """Shorten the wall limit so that the answer arrives before the caller's deadline."""
    if deadline is None:
        return req
    budget_ms = int((deadline - time.monotonic() - 0.05) * 1000)
    if budget_ms <= 0:
        raise DeadlineExceeded(
            "the call's deadline passed before the program could run; give the "
            "call a deadline longer than the program's wall limit plus queueing"
        )
    if budget_ms >= req.limits.wall_timeout_ms:
        return req
    return dataclasses.replace(
        req, limits=dataclasses.replace(req.limits, wall_timeout_ms=budget_ms)
    )


class Executor:
    def __init__(
        self,
        backend: Backend,
        policy: Policy | None = None,
        *,
        workers: int | None = None,
        queue: int | None = None,
    ):
        self.backend = backend
        self.policy = policy or Policy()
        self.workers = workers or os.cpu_count() or 1
        self.queue = self.workers * 4 if queue is None else queue
        self._slots: queue_mod.SimpleQueue[int] = queue_mod.SimpleQueue()
        for i in range(self.workers):
            self._slots.put(i)
        self._sem = asyncio.Semaphore(self.workers)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        self._admitted = 0
        self._mean_s = 0.05  # running estimate of an execution's time, for retry hints
        set_capacity(self.workers, self.queue)

    def _admit(self) -> None:
        if self._admitted >= self.workers + self.queue:
            REJECTED.inc()
            # Roughly when a place frees up: the queue ahead drains at `workers` per mean time.
            retry_ms = int(1000 * self._mean_s * (1 + self.queue / self.workers))
            raise ResourceExhausted(
                f"sandbox busy: {self.workers} running and {self.queue} queued; retry with backoff "
                f"(in about {retry_ms} ms)",
                retry_after_ms=max(retry_ms, 10),
            )
        self._admitted += 1

    def _run_blocking(self, fn, *args):
        slot = self._slots.get()  # never waits: the semaphore lets in at most `workers`
        RUNNING.inc()
        try:
            return fn(*args, slot)
        finally:
            RUNNING.dec()
            self._slots.put(slot)

    async def _in_slot(self, fn, *args):
        """Run `fn(*args, cancel, slot)` in a worker thread once a slot is free (caller
        admitted)."""
        cancel = threading.Event()
        try:
            QUEUE_DEPTH.inc()
            try:
                await self._sem.acquire()
            finally:
                QUEUE_DEPTH.dec()
            try:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._pool, self._run_blocking, fn, *args, cancel)
            except asyncio.CancelledError:
                cancel.set()  # the caller went away: stop the program so the slot frees at once
                raise
            finally:
                self._sem.release()
        finally:
            self._admitted -= 1

    def _run_one(
        self, req: ExecRequest, deadline: float | None, cancel: threading.Event, slot: int
    ) -> ExecResult:
        req = _fit_deadline(req, deadline)
        result = self.backend.run(req, slot, cancel)
        EXEC_SECONDS.labels(self.backend.name, result.verdict.value).observe(result.wall_ms / 1000)
        self._mean_s = 0.9 * self._mean_s + 0.1 * result.wall_ms / 1000
        return result

    async def execute(self, req: ExecRequest, *, deadline: float | None = None) -> ExecResult:
        """Validate, admit, run. `deadline` is a time.monotonic() instant the answer must beat."""
        req = check_exec(req, self.policy)
        self._admit()
        return await self._in_slot(self._run_one, req, deadline)

    def _run_cases(
        self, req: TestsRequest, deadline: float | None, cancel: threading.Event, slot: int
    ) -> TestsResult:
        results: list[CaseResult] = []
        failed = False
        budget = self.policy.max_tests_output_bytes
        for case in req.cases:
            if failed and req.stop_on_first_failure:
                results.append(CaseResult(passed=False, execution=None, skipped=True))
                continue
            run = ExecRequest(req.language, req.code, case.stdin, (), req.limits)
            ex = self._run_one(run, deadline, cancel, slot)
            passed = ex.ok and outputs_match(
                ex.stdout, case.expected_stdout, req.compare, req.float_tolerance
            )
            failed = failed or not passed
            ex, budget = _within(ex, budget)
            results.append(CaseResult(passed=passed, execution=ex))
        return TestsResult(tuple(results))

    async def run_tests(self, req: TestsRequest, *, deadline: float | None = None) -> TestsResult:
        """Run the program once per case, in order, in one slot (see outputs_match for
        `compare`)."""
        req = check_tests(req, self.policy)
        self._admit()
        return await self._in_slot(self._run_cases, req, deadline)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.backend.close()


def _within(ex: ExecResult, budget: int) -> tuple[ExecResult, int]:
    """`ex` with its outputs cut to what is left of a response's output budget, and what is left."""
    if len(ex.stdout) + len(ex.stderr) <= budget:
        return ex, budget - len(ex.stdout) - len(ex.stderr)
    out = ex.stdout[:budget]
    err = ex.stderr[: budget - len(out)]
    return dataclasses.replace(
        ex,
        stdout=out,
        stderr=err,
        stdout_truncated=ex.stdout_truncated or len(out) < len(ex.stdout),
        stderr_truncated=ex.stderr_truncated or len(err) < len(ex.stderr),
    ), 0

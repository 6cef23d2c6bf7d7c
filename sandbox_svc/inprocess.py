"""LocalSandbox: the SandboxClient interface over an in-process Executor.

For tests and single-process tools that want real isolated execution without running
sandbox_svc as a server; environments cannot tell the two apart.
"""

from __future__ import annotations

import time

from atgrpo.contract.sandbox import ExecRequest, ExecResult, TestsRequest, TestsResult
from atgrpo.contract.sandbox_api import SandboxAPI
from sandbox_svc.executor import Executor


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


class LocalSandbox(SandboxAPI):
    def __init__(self, executor: Executor):
        self.executor = executor

    async def _execute(self, req: ExecRequest, timeout_s: float | None) -> ExecResult:
        return await self.executor.execute(req, deadline=_deadline(timeout_s))

    async def _run_tests(self, req: TestsRequest, timeout_s: float | None) -> TestsResult:
        return await self.executor.run_tests(req, deadline=_deadline(timeout_s))

"""LocalSandbox: the SandboxClient interface over an in-process Executor.

For tests and single-process tools that want real isolated execution without running
sandbox_svc as a server; environments cannot tell the two apart.
"""

from __future__ import annotations

import time

from sandbox_svc.executor import Executor
from sandbox_svc.model import (
    SERVER_DEFAULTS,
    Compare,
    ExecRequest,
    ExecResult,
    Limits,
    TestCase,
    TestsRequest,
    TestsResult,
)


class LocalSandbox:
    def __init__(self, executor: Executor):
        self.executor = executor

    async def execute(self, code: str, *, stdin: bytes = b"", language: str = "python",
                      files: dict[str, bytes] | None = None, limits: Limits | None = None,
                      timeout_s: float | None = None) -> ExecResult:
        req = ExecRequest(language, code, stdin, tuple((files or {}).items()), limits or SERVER_DEFAULTS)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return await self.executor.execute(req, deadline=deadline)

    async def run_tests(self, code: str, cases: list[tuple[bytes, bytes]], *, language: str = "python",
                        compare: Compare = Compare.WHITESPACE, float_tolerance: float = 0.0,
                        limits: Limits | None = None, stop_on_first_failure: bool = False,
                        timeout_s: float | None = None) -> TestsResult:
        req = TestsRequest(language, code, tuple(TestCase(i, o) for i, o in cases), compare, float_tolerance,
                           limits or SERVER_DEFAULTS, stop_on_first_failure)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return await self.executor.run_tests(req, deadline=deadline)

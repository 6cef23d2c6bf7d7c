"""The calls environments make on a sandbox, shared by SandboxClient (over gRPC) and
LocalSandbox (in-process): both build the same requests and differ only in how they send them."""

from __future__ import annotations

from atgrpo.contract.sandbox import (
    SERVER_DEFAULTS,
    Compare,
    ExecRequest,
    ExecResult,
    Limits,
    TestCase,
    TestsRequest,
    TestsResult,
)


class SandboxAPI:
    async def _execute(self, req: ExecRequest, timeout_s: float | None) -> ExecResult:
        raise NotImplementedError

    async def _run_tests(self, req: TestsRequest, timeout_s: float | None) -> TestsResult:
        raise NotImplementedError

    async def execute(
        self,
        code: str,
        *,
        stdin: bytes = b"",
        language: str = "python",
        files: dict[str, bytes] | None = None,
        limits: Limits | None = None,
        timeout_s: float | None = None,
    ) -> ExecResult:
        """Run `code` once; unset limits (None or 0 fields) take the server's defaults."""
        req = ExecRequest(
            language, code, stdin, tuple((files or {}).items()), limits or SERVER_DEFAULTS
        )
        return await self._execute(req, timeout_s)

    async def run_tests(
        self,
        code: str,
        cases: list[tuple[bytes, bytes]],
        *,
        language: str = "python",
        compare: Compare = Compare.WHITESPACE,
        float_tolerance: float = 0.0,
        limits: Limits | None = None,
        stop_on_first_failure: bool = False,
        timeout_s: float | None = None,
    ) -> TestsResult:
        """Run `code` once per (stdin, expected stdout) case and compare its output."""
        req = TestsRequest(
            language,
            code,
            tuple(TestCase(i, o) for i, o in cases),
            compare,
            float_tolerance,
            limits or SERVER_DEFAULTS,
            stop_on_first_failure,
        )
        return await self._run_tests(req, timeout_s)

"""SandboxClient: what environments call to run model-written code (plain types in and out)."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2, sandbox_pb2_grpc
from atgrpo.rpc.client import ServiceClient
from sandbox_svc import convert
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

# Queueing on a busy sandbox takes time on top of the program's own wall limit.
_QUEUE_MARGIN_S = 30.0


class SandboxClient(ServiceClient):
    stub_class = sandbox_pb2_grpc.SandboxServiceStub

    async def get_info(self) -> common_pb2.ServiceInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

    async def execute(self, code: str, *, stdin: bytes = b"", language: str = "python",
                      files: dict[str, bytes] | None = None, limits: Limits | None = None,
                      timeout_s: float | None = None) -> ExecResult:
        req = ExecRequest(language, code, stdin, tuple((files or {}).items()), limits or SERVER_DEFAULTS)
        resp = await self._call(self.stub.Execute, convert.exec_request_to_pb(req),
                                timeout_s=timeout_s or self._timeout_for(req.limits, 1))
        return convert.exec_result_from_pb(resp)

    async def run_tests(self, code: str, cases: list[tuple[bytes, bytes]], *, language: str = "python",
                        compare: Compare = Compare.WHITESPACE, float_tolerance: float = 0.0,
                        limits: Limits | None = None, stop_on_first_failure: bool = False,
                        timeout_s: float | None = None) -> TestsResult:
        req = TestsRequest(language, code, tuple(TestCase(i, o) for i, o in cases), compare, float_tolerance,
                           limits or SERVER_DEFAULTS, stop_on_first_failure)
        resp = await self._call(self.stub.RunTests, convert.tests_request_to_pb(req),
                                timeout_s=timeout_s or self._timeout_for(req.limits, len(cases)))
        return convert.tests_result_from_pb(resp)

    def _timeout_for(self, limits: Limits, runs: int) -> float:
        wall_s = (limits.wall_timeout_ms or Limits().wall_timeout_ms) / 1000
        return max(self.timeout_s, wall_s * runs + _QUEUE_MARGIN_S)

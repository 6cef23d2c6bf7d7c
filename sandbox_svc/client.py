"""SandboxClient: what environments call to run model-written code (plain types in and out)."""

from __future__ import annotations

from atgrpo._proto.v1 import sandbox_pb2_grpc
from atgrpo.contract import sandbox_wire
from atgrpo.contract.sandbox import ExecRequest, ExecResult, Limits, TestsRequest, TestsResult
from atgrpo.contract.sandbox_api import SandboxAPI
from atgrpo.rpc.client import ServiceClient

# Queueing on a busy sandbox takes time on top of the program's own wall limit.
_QUEUE_MARGIN_S = 30.0


class SandboxClient(ServiceClient, SandboxAPI):
    stub_class = sandbox_pb2_grpc.SandboxServiceStub

    async def _execute(self, req: ExecRequest, timeout_s: float | None) -> ExecResult:
        resp = await self._call(
            self.stub.Execute,
            sandbox_wire.exec_request_to_pb(req),
            timeout_s=timeout_s or self._timeout_for(req.limits, 1),
        )
        return sandbox_wire.exec_result_from_pb(resp)

    async def _run_tests(self, req: TestsRequest, timeout_s: float | None) -> TestsResult:
        resp = await self._call(
            self.stub.RunTests,
            sandbox_wire.tests_request_to_pb(req),
            timeout_s=timeout_s or self._timeout_for(req.limits, len(req.cases)),
        )
        return sandbox_wire.tests_result_from_pb(resp)

    def _timeout_for(self, limits: Limits, runs: int) -> float:
        wall_s = (limits.wall_timeout_ms or Limits().wall_timeout_ms) / 1000
        return max(self.timeout_s, wall_s * runs + _QUEUE_MARGIN_S)

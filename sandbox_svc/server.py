"""SandboxService servicer: converts and delegates to the Executor, nothing more."""

from __future__ import annotations

import logging
import time

from grpc import aio

from atgrpo._proto.v1 import common_pb2, sandbox_pb2, sandbox_pb2_grpc
from atgrpo.contract import sandbox_wire
from atgrpo.rpc.server import Binding, service_info
from sandbox_svc.executor import Executor

log = logging.getLogger(__name__)


def _deadline(context) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._info = service_info(
            "sandbox",
            {
                "backend": executor.backend.name,
                "isolated": str(executor.backend.isolated).lower(),
                "workers": str(executor.workers),
                "queue": str(executor.queue),
            },
        )

    async def GetInfo(
        self, request: common_pb2.GetInfoRequest, context: aio.ServicerContext
    ) -> common_pb2.ServiceInfo:
        return self._info

    async def Execute(
        self, request: sandbox_pb2.ExecuteRequest, context: aio.ServicerContext
    ) -> sandbox_pb2.ExecuteResponse:
        result = await self.executor.execute(
            sandbox_wire.exec_request_from_pb(request), deadline=_deadline(context)
        )
        return sandbox_wire.exec_result_to_pb(result)

    async def RunTests(
        self, request: sandbox_pb2.RunTestsRequest, context: aio.ServicerContext
    ) -> sandbox_pb2.RunTestsResponse:
        result = await self.executor.run_tests(
            sandbox_wire.tests_request_from_pb(request), deadline=_deadline(context)
        )
        return sandbox_wire.tests_result_to_pb(result)


def bindings(executor: Executor) -> list[Binding]:
    return [
        Binding(
            "atgrpo.v1.SandboxService",
            SandboxServicer(executor),
            sandbox_pb2_grpc.add_SandboxServiceServicer_to_server,
        )
    ]

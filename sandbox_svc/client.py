"""SandboxClient: the typed client other services and the CLI use to reach the sandbox service."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2, sandbox_pb2_grpc
from atgrpo.rpc.client import ServiceClient


class SandboxClient(ServiceClient):
    stub_class = sandbox_pb2_grpc.SandboxServiceStub

    async def get_info(self) -> common_pb2.ServiceInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

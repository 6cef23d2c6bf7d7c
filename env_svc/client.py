"""EnvClient: the typed client other services and the CLI use to reach the env service."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2, env_pb2_grpc
from atgrpo.rpc.client import ServiceClient


class EnvClient(ServiceClient):
    stub_class = env_pb2_grpc.EnvServiceStub

    async def get_info(self) -> common_pb2.ServiceInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

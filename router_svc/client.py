"""RouterClient: the typed client other services and the CLI use to reach the router service."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2, router_pb2_grpc
from atgrpo.rpc.client import ServiceClient


class RouterClient(ServiceClient):
    stub_class = router_pb2_grpc.RouterServiceStub

    async def get_info(self) -> common_pb2.ServiceInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

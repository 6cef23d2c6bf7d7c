"""RolloutClient: the typed client other services and the CLI use to reach the rollout service."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from atgrpo.rpc.client import ServiceClient


class RolloutClient(ServiceClient):
    stub_class = rollout_pb2_grpc.RolloutServiceStub

    async def get_info(self) -> rollout_pb2.RolloutInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

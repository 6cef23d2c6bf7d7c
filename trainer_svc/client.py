"""TrainerClient: the typed client other services and the CLI use to reach the trainer service."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc
from atgrpo.rpc.client import ServiceClient


class TrainerClient(ServiceClient):
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    async def get_info(self) -> trainer_pb2.TrainerInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

"""EnvService servicer: thin; episode logic lives in plain modules (issue #4)."""

from __future__ import annotations

from atgrpo._proto.v1 import env_pb2_grpc
from atgrpo.rpc.server import Binding, service_info


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    """RPCs other than GetInfo answer UNIMPLEMENTED (through the generated base) until built."""

    def __init__(self) -> None:
        self._info = service_info("env")

    async def GetInfo(self, request, context):
        return self._info


def bindings(args=None) -> list[Binding]:
    return [Binding("atgrpo.v1.EnvService", EnvServicer(), env_pb2_grpc.add_EnvServiceServicer_to_server)]

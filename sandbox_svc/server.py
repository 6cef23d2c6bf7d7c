"""SandboxService servicer: thin; execution backends live in plain modules (issue #3)."""

from __future__ import annotations

from atgrpo._proto.v1 import sandbox_pb2_grpc
from atgrpo.rpc.server import Binding, service_info


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    """RPCs other than GetInfo answer UNIMPLEMENTED (through the generated base) until built."""

    def __init__(self) -> None:
        self._info = service_info("sandbox")

    async def GetInfo(self, request, context):
        return self._info


def bindings(args=None) -> list[Binding]:
    return [Binding("atgrpo.v1.SandboxService", SandboxServicer(),
                    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server)]

"""RouterService servicer: thin; the run loop lives in plain modules (issue #7)."""

from __future__ import annotations

from atgrpo._proto.v1 import router_pb2_grpc
from atgrpo.rpc.server import Binding, service_info


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    """RPCs other than GetInfo answer UNIMPLEMENTED (through the generated base) until built."""

    def __init__(self) -> None:
        self._info = service_info("router")

    async def GetInfo(self, request, context):
        return self._info


def bindings(args=None) -> list[Binding]:
    return [Binding("atgrpo.v1.RouterService", RouterServicer(),
                    router_pb2_grpc.add_RouterServiceServicer_to_server)]

"""RolloutService servicer: thin; engines and the tree driver live in plain modules (issue #5)."""

from __future__ import annotations

from atgrpo._proto.v1 import rollout_pb2, rollout_pb2_grpc
from atgrpo.rpc.server import Binding, service_info


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """RPCs other than GetInfo answer UNIMPLEMENTED (through the generated base) until built."""

    def __init__(self, engine: str = "none") -> None:
        # No engine is loaded yet, so no policy is served: GetInfo says so instead of inventing one.
        self._info = rollout_pb2.RolloutInfo(service=service_info("rollout", {"engine": engine}),
                                             engine=engine, device="cpu")

    async def GetInfo(self, request, context):
        return self._info


def bindings(args=None) -> list[Binding]:
    return [Binding("atgrpo.v1.RolloutService", RolloutServicer(),
                    rollout_pb2_grpc.add_RolloutServiceServicer_to_server)]

"""TrainerService servicer: thin; the update and weight push live in plain modules (issue #6)."""

from __future__ import annotations

from atgrpo._proto.v1 import trainer_pb2, trainer_pb2_grpc
from atgrpo.rpc.server import Binding, service_info


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """RPCs other than GetInfo answer UNIMPLEMENTED (through the generated base) until built."""

    def __init__(self, pool: str = "") -> None:
        # Until Setup is implemented the trainer holds no model: version 0, no run.
        self._info = trainer_pb2.TrainerInfo(service=service_info("trainer", {"pool": pool}), pool=pool)

    async def GetInfo(self, request, context):
        return self._info


def bindings(args=None) -> list[Binding]:
    pool = getattr(args, "pool", "") if args is not None else ""
    return [Binding("atgrpo.v1.TrainerService", TrainerServicer(pool),
                    trainer_pb2_grpc.add_TrainerServiceServicer_to_server)]

"""A fake rollout replica for the join-during-load fault (tests/e2e/test_elastic.py): a real gRPC
server in its own process that answers GetInfo like a replica serving nothing yet, takes a
LoadWeights stream to its end, writes `--marker` and then never answers, as a replica stuck
loading a large model would. The test kills it -9 there.

    python -m tests.e2e.hanging_replica --port-file F --marker M
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from grpc import aio

from atgrpo._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc


class Hanging(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, marker: Path):
        self.marker = marker

    async def GetInfo(self, request, context):
        return rollout_pb2.RolloutInfo(
            service=common_pb2.ServiceInfo(service="rollout"), engine="hf", device="cpu"
        )

    async def LoadWeights(self, request_iterator, context):
        async for _ in request_iterator:
            pass
        self.marker.write_text("loading")
        await asyncio.Event().wait()  # the load that never ends


async def main(port_file: Path, marker: Path) -> None:
    server = aio.server()
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(Hanging(marker), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(json.dumps({"port": port}))
    await server.wait_for_termination()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", type=Path, required=True)
    ap.add_argument("--marker", type=Path, required=True)
    args = ap.parse_args()
    asyncio.run(main(args.port_file, args.marker))

"""Docker HEALTHCHECK of the atgrpo images: exit 0 when the gRPC server on ATGRPO_PORT answers
the standard health check (grpc.health.v1, service "" = the server as a whole) with SERVING.

Kubernetes ignores HEALTHCHECK; the chart uses native gRPC probes against the same service.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, timeout_s: float) -> tuple[bool, str]:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
    except grpc.RpcError as err:
        return False, f"{address}: {err.code().name}: {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main() -> int:
    port = os.environ.get("ATGRPO_PORT", "50051")
    ok, text = check(
        f"localhost:{port}", float(os.environ.get("ATGRPO_HEALTHCHECK_TIMEOUT_S", "3"))
    )
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

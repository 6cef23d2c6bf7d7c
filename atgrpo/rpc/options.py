"""Channel and server options shared by every atgrpo process.

Message sizes are capped on both ends so that one oversized request cannot exhaust a server;
64 MiB fits a Collect batch or one weight chunk with room to spare (weights travel chunked).
"""

from __future__ import annotations

import json

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_DEADLINE_S = 30.0

# Transparent retries of UNAVAILABLE for the short unary calls (a replica restarting). Longer,
# non-idempotent calls (Train, Collect, LoadWeights) are retried by their clients explicitly.
_SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [
                {"service": f"atgrpo.v1.{s}", "method": m}
                for s, m in (
                    ("EnvService", "GetInfo"),
                    ("SandboxService", "GetInfo"),
                    ("RolloutService", "GetInfo"),
                    ("RouterService", "GetInfo"),
                    ("TrainerService", "GetInfo"),
                    ("RouterService", "GetRun"),
                )
            ]
            + [{"service": "grpc.health.v1.Health"}],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, object]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(_SERVICE_CONFIG)),
    ]


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, object]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # Let clients keep idle channels alive with pings every 30 s without being cut off.
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.so_reuseport", 0),
    ]

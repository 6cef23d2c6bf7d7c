"""Ask any atgrpo service for its health and GetInfo, knowing only its kind and address.

The CLI uses this (atgrpo imports no service package, DESIGN.md §3), so it talks to the
generated stubs directly.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo._proto.v1 import (
    common_pb2,
    env_pb2_grpc,
    rollout_pb2_grpc,
    router_pb2_grpc,
    sandbox_pb2_grpc,
    trainer_pb2_grpc,
)
from atgrpo.rpc.options import channel_options
from atgrpo.rpc.security import SecurityConfigError, open_channel

STUBS = {
    "env": env_pb2_grpc.EnvServiceStub,
    "sandbox": sandbox_pb2_grpc.SandboxServiceStub,
    "rollout": rollout_pb2_grpc.RolloutServiceStub,
    "router": router_pb2_grpc.RouterServiceStub,
    "trainer": trainer_pb2_grpc.TrainerServiceStub,
}


@dataclass
class Probe:
    kind: str
    address: str
    health: str = "UNKNOWN"
    version: str = ""
    instance: str = ""
    details: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.health == "SERVING"


async def probe(kind: str, address: str, timeout_s: float = 3.0) -> Probe:
    """Health and GetInfo of one service; failures are recorded in `.error`, never raised."""
    if kind not in STUBS:
        return Probe(
            kind, address, error=f"unknown service kind {kind!r}; expected one of {sorted(STUBS)}"
        )
    result = Probe(kind, address)
    try:
        channel = open_channel(address, options=channel_options())
    except SecurityConfigError as err:
        return Probe(kind, address, health="DOWN", error=str(err))
    async with channel:
        try:
            resp = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
            result.health = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            info = await STUBS[kind](channel).GetInfo(
                common_pb2.GetInfoRequest(), timeout=timeout_s
            )
        except aio.AioRpcError as err:
            result.health = "DOWN" if result.health == "UNKNOWN" else result.health
            result.error = f"{err.code().name}: {err.details()}"
            return result
    # Rollout and trainer wrap the common ServiceInfo in a richer message.
    svc = info.service if hasattr(info, "service") and not isinstance(info.service, str) else info
    result.version, result.instance, result.details = svc.version, svc.instance, dict(svc.details)
    return result


async def probe_all(targets: list[tuple[str, str]], timeout_s: float = 3.0) -> list[Probe]:
    return list(await asyncio.gather(*(probe(k, a, timeout_s) for k, a in targets)))

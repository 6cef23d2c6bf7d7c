"""create_server: an asyncio gRPC server with health, reflection, error mapping and metrics.

Every atgrpo service is built with it, so all of them answer the standard health check (which
Kubernetes' native gRPC probes use), list their services through reflection (grpcurl works), cap
message sizes and concurrency, and stop gracefully: on SIGTERM health turns NOT_SERVING, new calls
are refused, and calls in flight get `grace_s` to finish.

A server may start before its servicers exist (`create_server(None)`, then `open(bindings)`):
health answers NOT_SERVING and every other call UNAVAILABLE until then (atgrpo.rpc.gate), so a
replica loading its model for minutes is seen as starting, not as down. The health service
LIVENESS answers SERVING from the start: it tells "the process and its event loop answer" apart
from "ready for work" (Kubernetes' liveness and readiness probes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from atgrpo import __version__
from atgrpo._proto.v1 import common_pb2
from atgrpo.rpc.gate import Gate
from atgrpo.rpc.interceptors import ErrorAndMetricsInterceptor
from atgrpo.rpc.options import MAX_MESSAGE_BYTES, server_options
from atgrpo.rpc.security import ServerSecurity

log = logging.getLogger(__name__)

LIVENESS = "liveness"  # the health service name the liveness probes ask for


@dataclass(frozen=True)
class Binding:
    """One gRPC service to host: its full proto name, its servicer, and the generated adder."""

    name: str  # e.g. "atgrpo.v1.EnvService"
    servicer: Any
    add_to_server: Callable[[Any, aio.Server], None]


class SidePort(Protocol):
    """A port a service serves beside gRPC, on the same event loop (rollout_svc's OpenAI HTTP
    API): a servicer lists its own in `side_ports`. Opened once the servicers are built, with the
    gRPC port's host, TLS and token; closed with the gRPC server, its calls in flight given the
    same grace."""

    name: str  # its key in the port file, e.g. "http_port"

    async def open(self, host: str, security: ServerSecurity) -> int: ...

    async def close(self, grace_s: float) -> None: ...


@dataclass
class RunningServer:
    server: aio.Server
    port: int
    health: health.aio.HealthServicer
    names: list[str] = field(default_factory=list)
    security: ServerSecurity = field(default_factory=ServerSecurity)
    health_server: aio.Server | None = None  # the plaintext health-only port, when asked for
    health_port: int | None = None
    gate: Gate = field(default_factory=Gate)
    side_ports: dict[str, int] = field(default_factory=dict)  # SidePort.name -> bound port
    _sides: list[SidePort] = field(default_factory=list)

    async def open(self, bindings: Sequence[Binding], host: str | None = None) -> None:
        """Serve `bindings` from now on, and turn health SERVING. With a `host`, the servicers'
        side ports (SidePort) open on it first."""
        sides = [s for b in bindings for s in getattr(b.servicer, "side_ports", ())]
        for side in sides if host is not None else ():
            self.side_ports[side.name] = await side.open(host, self.security)
            self._sides.append(side)
        self.names = [b.name for b in bindings]
        self.gate.open(bindings, [*self.names, health.SERVICE_NAME, reflection.SERVICE_NAME])
        for name in ["", *self.names]:  # "" = the server as a whole, as probes ask
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Turn health NOT_SERVING, refuse new calls, and give calls in flight `grace_s` to end."""
        await self.health.enter_graceful_shutdown()
        await asyncio.gather(self.server.stop(grace_s), *(s.close(grace_s) for s in self._sides))
        if self.health_server is not None:
            await self.health_server.stop(0)


async def create_server(
    bindings: Sequence[Binding] | None,
    address: str = "127.0.0.1:0",
    *,
    max_concurrent_rpcs: int | None = 256,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    security: ServerSecurity | None = None,
    health_address: str | None = None,
) -> RunningServer:
    """Bind `address` (port 0 picks a free one), start serving, and return the bound port.

    Calls beyond `max_concurrent_rpcs` are refused with RESOURCE_EXHAUSTED by grpc itself, so a
    flood cannot queue without bound. `security` turns on TLS, mutual TLS and the token on the
    state-changing RPCs (atgrpo.rpc.security); `health_address` also serves the health check
    alone, in plaintext, for probes that cannot speak TLS (Kubernetes' native gRPC probes).
    `bindings` None: start NOT_SERVING; `RunningServer.open` serves them once they are built.
    """
    security = security or ServerSecurity()
    server = aio.server(
        interceptors=[ErrorAndMetricsInterceptor(), *security.interceptors()],
        options=server_options(max_message_bytes),
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    gate = Gate()
    server.add_generic_rpc_handlers((gate,))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = _bind(server, address, security.credentials())
    health_server = health_port = None
    if health_address is not None:
        health_server = aio.server(options=server_options(4096))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = _bind(health_server, health_address, None)
    # Before the start, so no probe ever sees "" SERVING (the servicer's default) while loading.
    await health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    await health_servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    await server.start()
    if health_server is not None:
        await health_server.start()
    running = RunningServer(
        server, port, health_servicer, [], security, health_server, health_port, gate
    )
    if bindings is not None:
        await running.open(bindings)
    return running


def _bind(server: aio.Server, address: str, credentials) -> int:
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc raises instead of returning 0 when nothing could be bound
        port = 0
    if port == 0:
        raise OSError(
            f"could not bind {address}: is the port in use? Pass --port 0 to pick a free one"
        )
    return port


async def serve_until_signal(running: RunningServer, grace_s: float = 5.0) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received: stopping (grace %.1fs)", grace_s)
    await running.stop(grace_s)


def service_info(service: str, details: dict[str, str] | None = None) -> common_pb2.ServiceInfo:
    """The GetInfo answer every service gives: its name, atgrpo's version, and this instance."""
    return common_pb2.ServiceInfo(
        service=service,
        version=__version__,
        instance=f"{socket.gethostname()}:{os.getpid()}",
        started_unix_ms=int(time.time() * 1000),
        details=details or {},
    )

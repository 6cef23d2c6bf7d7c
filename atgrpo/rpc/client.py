"""ServiceClient: the base of every service's typed client.

It owns an asyncio channel with atgrpo's options, gives every call a deadline, and raises the
domain errors of atgrpo.errors instead of grpc.RpcError, so callers decide on retries by type.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo.errors import RETRY_AFTER_KEY, AtgrpoError, error_for_status
from atgrpo.rpc.options import DEFAULT_DEADLINE_S, channel_options


def to_domain_error(err: aio.AioRpcError, target: str) -> AtgrpoError:
    retry_after = None
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            retry_after = int(value)
    message = err.details() or err.code().name
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        message = f"{target} is unavailable ({message}); is the service running at that address?"
    return error_for_status(err.code(), message, retry_after)


class ServiceClient:
    """Subclasses set `stub_class` and call `self._call(self.stub.Method, request)`."""

    stub_class: type = object

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_DEADLINE_S):
        self.address = address
        self.timeout_s = timeout_s
        self.channel = aio.insecure_channel(address, options=channel_options())
        self.stub = self.stub_class(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    async def _call(self, method: Any, request: Any, *, timeout_s: float | None = None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self.timeout_s)
        except aio.AioRpcError as err:
            raise to_domain_error(err, self.address) from None

    async def health(self, service: str = "", *, timeout_s: float = 2.0) -> str:
        """The health status name ("SERVING", "NOT_SERVING", ...); raises Unavailable when down."""
        resp = await self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service),
                                timeout_s=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

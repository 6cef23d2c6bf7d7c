"""ServiceClient: the base of every service's typed client.

It owns an asyncio channel with atgrpo's options, gives every call a deadline, and raises the
domain errors of atgrpo.errors instead of grpc.RpcError, so callers decide on retries by type.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo._proto.v1 import common_pb2
from atgrpo.contract.service import ServiceInfo
from atgrpo.contract.service_wire import service_info_from_pb
from atgrpo.errors import RETRY_AFTER_KEY, AtgrpoError, error_for_status
from atgrpo.rpc.options import DEFAULT_DEADLINE_S, channel_options
from atgrpo.rpc.security import open_channel


def to_domain_error(err: aio.AioRpcError, target: str) -> AtgrpoError:
    retry_after = None
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            retry_after = int(value)
    message = err.details() or err.code().name
    code = err.code()
    if code == grpc.StatusCode.CANCELLED:
        # A status this side did not cancel (that raises asyncio.CancelledError here) comes from
        # a server that stopped: grpc cancels the calls it had received but not yet started when
        # its stop began, grace or not. Like UNAVAILABLE, the call may go again, elsewhere.
        code = grpc.StatusCode.UNAVAILABLE
        message = f"{target} cancelled the call ({message}): it is stopping; retry it elsewhere"
    elif code == grpc.StatusCode.UNAVAILABLE:
        message = f"{target} is unavailable ({message}); is the service running at that address?"
    return error_for_status(code, message, retry_after)


class ServiceClient:
    """Subclasses set `stub_class` and call `self._call(self.stub.Method, request)`."""

    stub_class: type = object

    def __init__(self, address: str, *, timeout_s: float = DEFAULT_DEADLINE_S):
        self.address = address
        self.timeout_s = timeout_s
        # TLS, the client certificate and the auth token come from the environment (rpc.security).
        self.channel = open_channel(address, options=channel_options())
        self.stub = self.stub_class(self.channel)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    retry = True  # False: surface RESOURCE_EXHAUSTED / UNAVAILABLE at once (load shedding tests)

    async def _call(
        self,
        method: Any,
        request: Any,
        *,
        timeout_s: float | None = None,
        retry: bool | None = None,
    ) -> Any:
        """One call, retried with backoff on UNAVAILABLE and RESOURCE_EXHAUSTED (a service
        restarting, a full queue) until the deadline. A streamed request is given as a zero-arg
        callable that makes a fresh iterator for every attempt."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        delay = 0.05
        while True:
            try:
                return await method(
                    request() if callable(request) else request,
                    timeout=max(0.001, deadline - time.monotonic()),
                )
            except aio.AioRpcError as err:
                error = to_domain_error(err, self.address)
            wait = max(delay, (error.retry_after_ms or 0) / 1000)
            if (
                not (self.retry if retry is None else retry)
                or not error.retryable
                or time.monotonic() + wait >= deadline
            ):
                raise error
            await asyncio.sleep(wait)
            delay = min(delay * 2, 2.0)

    async def get_info(self) -> ServiceInfo:
        """What the service says of itself (the rollout and trainer clients say more)."""
        return service_info_from_pb(
            await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())
        )

    async def health(self, service: str = "", *, timeout_s: float = 2.0) -> str:
        """The health status name ("SERVING", "NOT_SERVING", ...); raises Unavailable when down."""
        resp = await self._call(
            self._health.Check, health_pb2.HealthCheckRequest(service=service), timeout_s=timeout_s
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

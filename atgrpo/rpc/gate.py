"""Serve before the servicers exist: a gRPC server's services are fixed once it starts, but a
rollout replica needs minutes to load its model, and health and /metrics must answer meanwhile.

The server is started with one generic handler, the Gate. Until `open(bindings)` it answers every
call (health aside, which is registered on its own) with UNAVAILABLE, which clients retry; after,
it hands each call to the handlers the bindings' generated `add_*_to_server` adders registered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from atgrpo.errors import RETRY_AFTER_KEY
from atgrpo.rpc.interceptors import drain

RETRY_AFTER_MS = 1000


class _Capture:
    """Stands in for the server the generated adders register their handlers with."""

    def __init__(self) -> None:
        self.methods: dict[str, grpc.RpcMethodHandler] = {}
        self.generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self.methods.update({f"/{service}/{name}": h for name, h in handlers.items()})


async def _loading(requests: Any, context: grpc.aio.ServicerContext) -> None:
    await drain(requests)  # a client still streaming would see INTERNAL, not this retryable status
    await context.abort(
        grpc.StatusCode.UNAVAILABLE,
        "the service is still starting (loading its model); retry in a few seconds",
        trailing_metadata=((RETRY_AFTER_KEY, str(RETRY_AFTER_MS)),),
    )


# A stream-stream handler answers any kind of call at once, without waiting for a request.
_LOADING = grpc.stream_stream_rpc_method_handler(_loading)


class Gate(grpc.GenericRpcHandler):
    def __init__(self) -> None:
        self._capture: _Capture | None = None

    @property
    def is_open(self) -> bool:
        return self._capture is not None

    def open(self, bindings: Sequence[Any], names: Sequence[str]) -> None:
        """Serve `bindings` (atgrpo.rpc.server.Binding), with reflection listing `names`."""
        capture = _Capture()
        for b in bindings:
            b.add_to_server(b.servicer, capture)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer(names), capture
        )
        self._capture = capture

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        capture = self._capture
        if capture is None:
            return _LOADING
        handler = capture.methods.get(handler_call_details.method)
        for generic in capture.generic:
            if handler is not None:
                break
            handler = generic.service(handler_call_details)
        return handler  # None: grpc answers UNIMPLEMENTED

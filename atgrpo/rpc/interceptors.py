"""One server interceptor that turns exceptions into statuses and counts every call.

Servicers raise `atgrpo.errors.AtgrpoError` subclasses (or nothing); this maps them to the codes
of DESIGN.md §4, turns a generated servicer's NotImplementedError into UNIMPLEMENTED with a
message naming the RPC, and turns any other exception into INTERNAL while the server keeps
serving. A request whose bytes do not parse as the RPC's message (truncated, corrupted, another
type) is INVALID_ARGUMENT, not grpc's UNKNOWN. Metrics follow the `atgrpo_<what>_<unit>` naming
of DESIGN.md §4.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc import aio
from prometheus_client import Counter, Histogram

from atgrpo import __version__
from atgrpo.errors import RETRY_AFTER_KEY, AtgrpoError, InvalidArgument

log = logging.getLogger(__name__)

RPC_HANDLED = Counter(
    "atgrpo_rpc_handled_total",
    "RPCs completed, by service, method and status code.",
    ["service", "method", "code"],
)
RPC_SECONDS = Histogram(
    "atgrpo_rpc_duration_seconds",
    "Server-side RPC latency.",
    ["service", "method"],
    buckets=(
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
        60,
        300,
    ),
)


# A status message travels in a header that grpc caps (8 KiB soft, 16 KiB hard, percent-encoded);
# over the cap the client would see RESOURCE_EXHAUSTED instead of the real status. Messages that
# quote a caller's huge input are cut to fit.
MAX_STATUS_MESSAGE_BYTES = 2048


def _fit(message: str) -> str:
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    head = data[:MAX_STATUS_MESSAGE_BYTES].decode("utf-8", "ignore")
    return f"{head}... [{len(data) - len(head.encode())} more bytes of this message cut]"


class _Call:
    """Bookkeeping for one call: its names, the status it ended with, and how to abort it."""

    def __init__(self, full_method: str, context: aio.ServicerContext):
        service, _, method = full_method.lstrip("/").rpartition("/")
        self.full_method, self.service, self.method = full_method, service, method
        self.context = context
        self.code = grpc.StatusCode.OK
        self.start = time.perf_counter()

    async def fail(self, exc: BaseException) -> None:
        """Abort the call with the status `exc` stands for (raises grpc's AbortError)."""
        if isinstance(exc, AtgrpoError):
            code, message = exc.code, exc.message
            if exc.retry_after_ms is not None:
                self.context.set_trailing_metadata(((RETRY_AFTER_KEY, str(exc.retry_after_ms)),))
        elif isinstance(exc, NotImplementedError):
            code = grpc.StatusCode.UNIMPLEMENTED
            message = (
                f"{self.full_method} is not implemented in atgrpo {__version__}; "
                "this build serves health, reflection and GetInfo for it"
            )
        else:
            log.exception("unhandled error in %s", self.full_method)
            code = grpc.StatusCode.INTERNAL
            message = (
                f"internal error in {self.full_method}: {type(exc).__name__}: {exc}. "
                "This is a bug in atgrpo (the server keeps serving); report it with the server log"
            )
        self.code = code
        await self.context.abort(code, _fit(message))

    def done(self) -> None:
        code = self.context.code() if self.code == grpc.StatusCode.OK else self.code
        if isinstance(code, int) or code is None:  # set_code() with an int, or never set
            code = self.code
        RPC_HANDLED.labels(self.service, self.method, code.name).inc()
        RPC_SECONDS.labels(self.service, self.method).observe(time.perf_counter() - self.start)


class _Undecodable:
    """Stands in for a request whose bytes did not parse; the handler then refuses the call."""

    def __init__(self, error: str):
        self.error = error


def _safe_deserializer(deserialize: Callable | None, full_method: str) -> Callable | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, or whatever a custom parser raises
            return _Undecodable(f"{type(exc).__name__}: {exc}")

    return parse


def _undecodable(error: _Undecodable, full_method: str) -> InvalidArgument:
    return InvalidArgument(
        f"the request to {full_method} is not a valid message of its type ({error.error}); "
        "send the serialized request message the .proto declares (truncated or corrupted "
        "bytes, or another message type, do not parse)"
    )


def _checked(request: Any, full_method: str) -> Any:
    if isinstance(request, _Undecodable):
        raise _undecodable(request, full_method)
    return request


async def _checked_stream(requests: AsyncIterator[Any], full_method: str) -> AsyncIterator[Any]:
    async for request in requests:
        yield _checked(request, full_method)


async def _resolve(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


async def _iterate(result: Any) -> AsyncIterator[Any]:
    """Yield from whatever a streaming handler returned: async gen, sync iterable or awaitable."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    elif inspect.isawaitable(result):
        await result  # handler wrote responses with context.write()
    elif result is not None:
        for item in result:
            yield item


# grpc's asyncio client loses the status of a client-streaming call that the server ends before
# the client has sent its last message (grpc/grpc#36066): a write that meets the closed stream
# replaces the server's code and message with INTERNAL "Internal error from Core", which is not
# retryable and names nothing. So a streamed request that fails is read to its end (and thrown
# away) before the status goes out, for at most this long; a client still sending after that
# gets the status as soon as grpc can deliver it.
DRAIN_S = 30.0


async def drain(requests: Any, limit_s: float | None = None) -> None:
    """Read and drop what is left of a request stream, until the client half-closes or `limit_s`
    (default DRAIN_S) passes. Errors reading it (the client cancelled) end the drain: the status
    still goes out."""

    async def read_all() -> None:
        async for _ in requests:
            pass

    try:
        await asyncio.wait_for(read_all(), DRAIN_S if limit_s is None else limit_s)
    except Exception:  # noqa: BLE001 - a timeout or a cancelled client: the drain only ever helps
        pass


def _wrap_unary_response(fn: Callable, full_method: str, streamed: bool = False) -> Callable:
    async def handler(request: Any, context: aio.ServicerContext) -> Any:
        call = _Call(full_method, context)
        raw = request
        try:
            request = (
                _checked_stream(request, full_method)
                if streamed
                else _checked(request, full_method)
            )
            return await _resolve(fn(request, context))
        except aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status
            if streamed:
                await drain(raw)
            await call.fail(exc)
        finally:
            call.done()

    return handler


def _wrap_stream_response(fn: Callable, full_method: str, streamed: bool = False) -> Callable:
    async def handler(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        call = _Call(full_method, context)
        raw = request
        try:
            request = (
                _checked_stream(request, full_method)
                if streamed
                else _checked(request, full_method)
            )
            async for item in _iterate(fn(request, context)):
                yield item
        except aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001
            if streamed:
                await drain(raw)
            await call.fail(exc)
        finally:
            call.done()

    return handler


class ErrorAndMetricsInterceptor(aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        name = handler_call_details.method
        kw = dict(
            request_deserializer=_safe_deserializer(handler.request_deserializer, name),
            response_serializer=handler.response_serializer,
        )
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary_response(handler.unary_unary, name), **kw
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary_response(handler.stream_unary, name, streamed=True), **kw
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream_response(handler.unary_stream, name), **kw
            )
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream_response(handler.stream_stream, name, streamed=True), **kw
        )

"""atgrpo.rpc over real gRPC on loopback: error mapping, metrics, health, graceful shutdown.

The services under test here are small generic handlers written for the test (raw bytes in and
out), so each rule of the interceptor is pinned without depending on any service's logic. Events
are ordered by waiting for them (a call held in its handler, a refusal seen by the client), never
by sleeping for a guessed time.
"""

import asyncio

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from atgrpo import errors
from atgrpo.rpc import interceptors
from atgrpo.rpc.client import ServiceClient
from atgrpo.rpc.server import Binding, create_server

SERVICE = "test.v1.Probe"


async def _sleep(request: bytes, context) -> bytes:
    await asyncio.sleep(float(request.decode()))
    return b"slept"


async def _fail(request: bytes, context) -> bytes:
    kind = request.decode()
    if kind == "invalid":
        raise errors.InvalidArgument("k must be >= 1; set algorithm.k to a positive integer")
    if kind == "busy":
        raise errors.ResourceExhausted("queue full; retry later", retry_after_ms=250)
    if kind == "todo":
        raise NotImplementedError
    raise ValueError("boom")


async def _cancel(request: bytes, context) -> bytes:
    await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")  # as a stopping server ends a call


async def _stream(request: bytes, context):
    for i in range(3):
        yield str(i).encode()
    raise errors.FailedPrecondition("policy version moved on; recollect")


class Hold:
    """The handler of method Hold: each call stays in flight until `release` is set; `inside`
    counts the calls in it now."""

    def __init__(self) -> None:
        self.inside = 0
        self.release = asyncio.Event()

    async def handle(self, request: bytes, context) -> bytes:
        self.inside += 1
        try:
            await self.release.wait()
            return b"held"
        finally:
            self.inside -= 1


class Refuse:
    """The handler of method Upload, a client-streaming call: it reads the first message and
    refuses the call; `refused` is set once it has raised."""

    def __init__(self) -> None:
        self.refused = asyncio.Event()

    async def handle(self, requests, context) -> bytes:
        async for _first in requests:
            self.refused.set()
            raise errors.InvalidArgument("the first message is refused; send a header first")
        return b"empty"


def _binding(hold: Hold | None = None, refuse: Refuse | None = None) -> Binding:
    methods = {
        "Sleep": grpc.unary_unary_rpc_method_handler(_sleep),
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
        "Cancel": grpc.unary_unary_rpc_method_handler(_cancel),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Upload": grpc.stream_unary_rpc_method_handler((refuse or Refuse()).handle),
    }
    if hold is not None:
        methods["Hold"] = grpc.unary_unary_rpc_method_handler(hold.handle)
    handler = grpc.method_handlers_generic_handler(SERVICE, methods)
    return Binding(
        SERVICE, None, lambda _servicer, server: server.add_generic_rpc_handlers((handler,))
    )


class _ProbeClient(ServiceClient):
    """Calls methods by path; `refused` has the status of every attempt that failed, retried or
    not (the client's retries made visible)."""

    stub_class = staticmethod(lambda channel: channel)

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.refused: list[grpc.StatusCode] = []

    async def call(self, method: str, payload: bytes, timeout_s: float = 5.0, retry: bool = True):
        rpc = self.channel.unary_unary(f"/{SERVICE}/{method}")

        async def attempt(request: bytes, timeout: float) -> bytes:
            try:
                return await rpc(request, timeout=timeout)
            except aio.AioRpcError as err:
                self.refused.append(err.code())
                raise

        return await self._call(attempt, payload, timeout_s=timeout_s, retry=retry)


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    """Poll `condition()` until it holds; fail naming `what` after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"waited {timeout_s} s for {what}"
        await asyncio.sleep(0.005)


async def refused_soon(client: _ProbeClient, timeout_s: float = 10.0) -> bool:
    """Whether a new call (Sleep(0), no retries) is refused as UNAVAILABLE within `timeout_s`
    (a call that meets the server just as it begins to stop is cancelled, which the client also
    reads as UNAVAILABLE); calls before that one may still be answered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        try:
            await client.call("Sleep", b"0", timeout_s=2, retry=False)
        except errors.Unavailable:
            return True
        await asyncio.sleep(0.005)
    return False


def run(coro):
    return asyncio.run(coro)


def test_domain_errors_become_their_status_codes_and_back():
    async def go():
        running = await create_server([_binding()])
        async with _ProbeClient(f"127.0.0.1:{running.port}") as c:
            with pytest.raises(errors.InvalidArgument, match="set algorithm.k"):
                await c.call("Fail", b"invalid")
            with pytest.raises(errors.ResourceExhausted) as busy:
                await c.call("Fail", b"busy")
            assert busy.value.retryable and busy.value.retry_after_ms == 250
            with pytest.raises(
                errors.Unimplemented, match="/test.v1.Probe/Fail is not implemented"
            ):
                await c.call("Fail", b"todo")
            with pytest.raises(errors.Internal, match="ValueError: boom.*keeps serving"):
                await c.call("Fail", b"other")
            # The server is still up after an unexpected exception.
            assert await c.call("Sleep", b"0") == b"slept"
        await running.stop(0)

    run(go())


def test_a_call_the_server_cancelled_is_unavailable_and_retried():
    """grpc cancels the calls a server had received but not started when its stop began: for the
    caller, that server is gone (a rollout replica scaled down mid-Collect), not a bug."""

    async def go():
        running = await create_server([_binding()])
        try:
            async with _ProbeClient(f"127.0.0.1:{running.port}") as c:
                with pytest.raises(errors.Unavailable) as once:
                    await c.call("Cancel", b"", retry=False)
                retried = len(c.refused)
                with pytest.raises(errors.Unavailable):
                    await c.call("Cancel", b"", timeout_s=0.5)
                return once.value, retried, len(c.refused) - retried
        finally:
            await running.stop(0)

    err, once, retried = run(go())
    assert err.retryable and "cancelled the call" in err.message and "127.0.0.1" in err.message
    assert once == 1 and retried > 1  # with retries on, the client tried again until its deadline


def test_streaming_error_after_items_keeps_items_and_code():
    async def go():
        running = await create_server([_binding()])
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            call = ch.unary_stream(f"/{SERVICE}/Stream")(b"", timeout=5)
            got = []
            with pytest.raises(aio.AioRpcError) as err:
                async for item in call:
                    got.append(item)
            assert got == [b"0", b"1", b"2"]
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await running.stop(0)

    run(go())


def test_a_refused_stream_is_read_to_its_end_so_the_client_gets_the_status():
    """grpc's asyncio client turns a status that arrives while it is still writing into INTERNAL
    "Internal error from Core" (grpc/grpc#36066; CI met it on LoadWeights). The server reads
    the refused stream to its end first: every write after the refusal succeeds, and the client
    gets the server's code and message."""

    async def go():
        refuse = Refuse()
        running = await create_server([_binding(refuse=refuse)])
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            call = ch.stream_unary(f"/{SERVICE}/Upload")(timeout=10)
            await call.write(b"first")
            await refuse.refused.wait()
            for _ in range(200):
                await call.write(b"x" * 16)
            await call.done_writing()
            with pytest.raises(aio.AioRpcError) as err:
                await call
        await running.stop(0)
        return err.value

    err = run(go())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "the first message is refused; send a header first"


def test_a_client_that_never_finishes_its_stream_gets_the_status_after_the_drain_limit(monkeypatch):
    monkeypatch.setattr(interceptors, "DRAIN_S", 0.2)

    async def go():
        running = await create_server([_binding()])
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            call = ch.stream_unary(f"/{SERVICE}/Upload")(timeout=10)
            await call.write(b"first")  # and never half-closes
            with pytest.raises(aio.AioRpcError) as err:
                await asyncio.wait_for(call, 5)
        await running.stop(0)
        return err.value

    assert run(go()).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_metrics_count_calls_by_code():
    def count(code):
        return (
            REGISTRY.get_sample_value(
                "atgrpo_rpc_handled_total", {"service": SERVICE, "method": "Fail", "code": code}
            )
            or 0.0
        )

    async def go():
        running = await create_server([_binding()])
        async with _ProbeClient(f"127.0.0.1:{running.port}") as c:
            for _ in range(2):
                with pytest.raises(errors.InvalidArgument):
                    await c.call("Fail", b"invalid")
        await running.stop(0)

    before = count("INVALID_ARGUMENT")
    run(go())
    assert count("INVALID_ARGUMENT") == before + 2


def test_health_serving_then_not_serving_on_shutdown():
    async def go():
        running = await create_server([_binding()])
        async with aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for name in ("", SERVICE):
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(aio.AioRpcError) as err:
                await stub.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=2)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            await running.health.enter_graceful_shutdown()
            resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await running.stop(0)

    run(go())


def test_graceful_stop_finishes_in_flight_and_refuses_new_calls():
    async def go():
        hold = Hold()
        running = await create_server([_binding(hold)])
        address = f"127.0.0.1:{running.port}"
        async with _ProbeClient(address) as c:
            in_flight = asyncio.create_task(c.call("Hold", b"", timeout_s=30))
            await until(lambda: hold.inside == 1, "the call to reach its handler")
            stopping = asyncio.create_task(running.stop(grace_s=30))
            async with _ProbeClient(address) as late:
                refused = await refused_soon(late)
            still_in_flight = not in_flight.done() and not stopping.done()
            hold.release.set()
            result = await in_flight
            await stopping
        return refused, still_in_flight, result

    refused, still_in_flight, result = run(go())
    assert refused  # new calls get UNAVAILABLE once the server stops...
    assert still_in_flight  # ...while the call made before is still running
    assert result == b"held"  # and that one finished within the grace period


def test_concurrency_cap_refuses_with_resource_exhausted():
    async def go():
        hold = Hold()
        running = await create_server([_binding(hold)], max_concurrent_rpcs=2)
        async with _ProbeClient(f"127.0.0.1:{running.port}") as c:
            calls = [
                asyncio.create_task(c.call("Hold", b"", timeout_s=30, retry=False))
                for _ in range(4)
            ]
            await until(
                lambda: hold.inside == 2 and sum(t.done() for t in calls) == 2,
                "two calls held and two refused",
            )
            hold.release.set()
            refused = await asyncio.gather(*calls, return_exceptions=True)

            hold.release = asyncio.Event()
            c.refused.clear()
            calls = [asyncio.create_task(c.call("Hold", b"", timeout_s=30)) for _ in range(4)]
            await until(
                lambda: hold.inside == 2 and c.refused, "two calls held and a third refused"
            )
            hold.release.set()
            retried = await asyncio.gather(*calls)
            retried_after = set(c.refused)
        await running.stop(0)
        return refused, retried, retried_after

    refused, retried, retried_after = run(go())
    assert refused.count(b"held") == 2
    assert sum(isinstance(r, errors.ResourceExhausted) for r in refused) == 2
    assert retried == [b"held"] * 4  # the client backs off and retries within its deadline
    assert retried_after == {grpc.StatusCode.RESOURCE_EXHAUSTED}


def test_a_restarting_service_is_waited_for_within_the_deadline():
    """UNAVAILABLE is retried with backoff: a call made while the server is down succeeds once a
    server listens on the address again, before the deadline."""

    async def go():
        first = await create_server([_binding()])
        port = first.port
        await first.stop(0)
        async with _ProbeClient(f"127.0.0.1:{port}") as c:
            pending = asyncio.ensure_future(c.call("Sleep", b"0", timeout_s=30))
            await until(lambda: c.refused, "the call to be refused by the closed port")
            waiting = not pending.done()
            second = await create_server([_binding()], f"127.0.0.1:{port}")
            try:
                return waiting, await pending, set(c.refused)
            finally:
                await second.stop(0)

    waiting, result, refused = run(go())
    assert waiting  # refused while the server was down, and still retrying
    assert refused == {grpc.StatusCode.UNAVAILABLE}
    assert result == b"slept"  # answered by the server that came back


def test_unreachable_address_is_unavailable_and_retryable():
    async def go():
        async with _ProbeClient("127.0.0.1:1") as c:
            with pytest.raises(errors.Unavailable, match="is the service running") as err:
                await c.call("Sleep", b"0", timeout_s=2)
            assert err.value.retryable

    run(go())


def test_oversized_request_is_refused_and_the_server_keeps_serving():
    async def go():
        running = await create_server([_binding()], max_message_bytes=1024)
        async with _ProbeClient(f"127.0.0.1:{running.port}") as c:
            # The same message is refused every time: raised at once, not retried until the
            # deadline.
            with pytest.raises(errors.MessageTooLarge, match="send less per call") as err:
                await asyncio.wait_for(c.call("Sleep", b"0" * 4096, timeout_s=60), 10)
            assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not err.value.retryable
            assert await c.call("Sleep", b"0") == b"slept"
        await running.stop(0)

    run(go())

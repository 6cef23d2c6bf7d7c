"""A service serves from its first second: while its servicers build (a rollout replica loading
its model) health answers NOT_SERVING, /metrics answers with atgrpo_service_ready 0, the liveness
health service answers SERVING and other calls are refused as UNAVAILABLE; then it serves."""

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo._proto.v1 import common_pb2, router_pb2_grpc
from atgrpo.rpc.server import LIVENESS

BUILD_S = 3.0
# A router whose build blocks BUILD_S seconds in a thread, as rollout's model load does.
SLOW_ROUTER = f"""
import asyncio, sys, time
from atgrpo.rpc.main import run_service
from router_svc.server import bindings

async def build(_):
    await asyncio.to_thread(time.sleep, {BUILD_S})
    return bindings()

run_service("router", build, argv=sys.argv[1:])
"""
SERVING, NOT_SERVING = (
    health_pb2.HealthCheckResponse.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        return r.read().decode()


async def _state(address: str) -> tuple[int, int, grpc.StatusCode]:
    """(health of "", health of LIVENESS, the status GetInfo gets)."""
    async with aio.insecure_channel(address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        whole = (await health.Check(health_pb2.HealthCheckRequest(), timeout=2)).status
        live = (
            await health.Check(health_pb2.HealthCheckRequest(service=LIVENESS), timeout=2)
        ).status
        try:
            await router_pb2_grpc.RouterServiceStub(ch).GetInfo(
                common_pb2.GetInfoRequest(), timeout=2
            )
            code = grpc.StatusCode.OK
        except aio.AioRpcError as err:
            code = err.code()
            assert "still starting" in err.details() and "retry" in err.details(), err.details()
        return whole, live, code


@pytest.fixture
def slow_service(tmp_path, subprocess_env):
    port, metrics_port, port_file = _free_port(), _free_port(), tmp_path / "port.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLOW_ROUTER,
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--port-file",
            str(port_file),
        ],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    yield proc, port, metrics_port, port_file
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_health_and_metrics_answer_while_the_service_builds_then_it_serves(slow_service):
    proc, port, metrics_port, port_file = slow_service
    address = f"127.0.0.1:{port}"
    seen_loading = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode()
        # Looked at before the state: the port file comes after SERVING, so a file seen now with a
        # state still loading after it is the bug (looked at after, a build ending in between is
        # not).
        written = port_file.exists()
        try:
            text = _scrape(metrics_port)
            state = asyncio.run(_state(address))
        except (OSError, aio.AioRpcError):  # not listening yet: the interpreter is importing
            time.sleep(0.1)
            continue
        if state[0] == SERVING:
            break
        if state[2] == grpc.StatusCode.OK:
            # The build ended between the health check and the call (the gate opens just before
            # health turns SERVING): the next look must find it serving.
            continue
        # Loading: health NOT_SERVING, the process live, calls refused, no port file yet.
        assert state == (NOT_SERVING, SERVING, grpc.StatusCode.UNAVAILABLE)
        assert 'atgrpo_service_ready{service="router"} 0.0' in text
        assert not written
        seen_loading = True
        time.sleep(0.2)
    assert seen_loading, "the service was never seen loading: it should answer during its 3 s build"
    assert asyncio.run(_state(address)) == (SERVING, SERVING, grpc.StatusCode.OK)
    assert json.loads(port_file.read_text())["port"] == port
    text = _scrape(metrics_port)
    assert 'atgrpo_service_ready{service="router"} 1.0' in text
    built = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('atgrpo_service_build_seconds{service="router"}')
    )
    assert BUILD_S <= built < BUILD_S + 5

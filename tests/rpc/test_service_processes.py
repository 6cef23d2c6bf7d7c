"""Each service runs alone as `python -m <kind>_svc`, answers health, reflection and GetInfo over
real gRPC, answers a request about something it does not hold with NOT_FOUND (never fake data),
and exits cleanly on SIGTERM."""

import asyncio
import json
import signal
import subprocess
import time

import grpc
import pytest
from grpc import aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from atgrpo import __version__
from atgrpo._proto.v1 import router_pb2
from atgrpo.rpc.probe import STUBS, probe
from tests.conftest import SERVICE_KINDS

FULL_NAMES = {
    "env": "atgrpo.v1.EnvService",
    "sandbox": "atgrpo.v1.SandboxService",
    "rollout": "atgrpo.v1.RolloutService",
    "router": "atgrpo.v1.RouterService",
    "trainer": "atgrpo.v1.TrainerService",
}
# A valid request about a thing the fresh service does not hold.
ABSENT = {
    "router": ("GetRun", router_pb2.GetRunRequest(run_id="r"), "no run 'r' on this router"),
}


@pytest.fixture
def service(request, tmp_path, python, subprocess_env):
    kind = request.param
    port_file = tmp_path / "port.json"
    proc = subprocess.Popen(
        [python, "-m", f"{kind}_svc", "--port", "0", "--port-file", str(port_file)],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, f"{kind} did not report its port"
        time.sleep(0.05)
    yield kind, f"127.0.0.1:{json.loads(port_file.read_text())['port']}", proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def _list_services(address: str) -> set[str]:
    async with aio.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        async for resp in responses:
            return {s.name for s in resp.list_services_response.service}
    return set()


async def _call_absent(kind: str, address: str) -> tuple[grpc.StatusCode, str]:
    method, request, _ = ABSENT[kind]
    async with aio.insecure_channel(address) as ch:
        try:
            await getattr(STUBS[kind](ch), method)(request, timeout=5)
        except aio.AioRpcError as err:
            return err.code(), err.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("service", SERVICE_KINDS, indirect=True)
def test_service_serves_health_reflection_info_and_stops_on_sigterm(service):
    kind, address, proc = service
    result = asyncio.run(probe(kind, address))
    assert result.health == "SERVING", result.error
    assert result.version == __version__
    assert result.instance.endswith(f":{proc.pid}")

    services = asyncio.run(_list_services(address))
    assert {
        FULL_NAMES[kind],
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services

    if kind in ABSENT:
        code, details = asyncio.run(_call_absent(kind, address))
        assert code == grpc.StatusCode.NOT_FOUND
        assert ABSENT[kind][2] in details and "StartRun" in details

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert asyncio.run(probe(kind, address, timeout_s=1)).health == "DOWN"


@pytest.mark.parametrize("service", ["trainer"], indirect=True)
def test_bad_port_is_refused_with_a_message(service, python, subprocess_env):
    _, address, _ = service
    taken = address.rsplit(":", 1)[1]
    out = subprocess.run(
        [python, "-m", "env_svc", "--port", taken],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert f"could not bind 127.0.0.1:{taken}" in out.stderr

"""TLS and mutual TLS, by configuration: real services talk to each other over mTLS with every
client taking its credentials from the environment, and clients without the right credentials
are refused at the handshake."""

import asyncio
import json
import os
import subprocess
import sys

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo import errors
from atgrpo.rpc.security import ClientSecurity, SecurityConfigError, ServerSecurity, open_channel
from atgrpo.rpc.server import create_server
from atgrpo.sdk.client import EnvClient
from router_svc.client import RouterClient
from router_svc.server import bindings as router_bindings
from tests.conftest import ROOT
from tests.security.conftest import TOKEN, start_service, tls_client_env

SUM = "train-sum-two"
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def server_security(pki, *, mutual=True, token=TOKEN) -> ServerSecurity:
    return ServerSecurity.from_files(
        pki.server_pem, pki.server_key, pki.ca_pem if mutual else None, token=token
    )


async def health(channel) -> str:
    resp = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5
    )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


@pytest.fixture(scope="module")
def mtls_services(pki, tmp_path_factory):
    """sandbox_svc and env_svc as processes, mTLS and token on both, configured by flags for the
    server side and by the environment for env_svc's own calls to the sandbox."""
    tmp = tmp_path_factory.mktemp("mtls")
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server_flags = [
        "--tls-cert",
        pki.server_pem,
        "--tls-key",
        pki.server_key,
        "--tls-client-ca",
        pki.ca_pem,
        "--auth-token-file",
        str(token_file),
    ]
    client = tls_client_env(pki, token=None) | {"ATGRPO_AUTH_TOKEN_FILE": str(token_file)}
    sandbox = start_service("sandbox", tmp, server_flags, client)
    try:
        env = start_service("env", tmp, [*server_flags, "--sandbox", sandbox.address], client)
    except BaseException:
        sandbox.stop()
        raise
    yield {"sandbox": sandbox, "env": env}
    env.stop()
    sandbox.stop()


def test_services_talk_over_mutual_tls_end_to_end(mtls_services, pki, client_env):
    """A client -> env_svc -> sandbox_svc, both hops over mTLS: the coder's program runs in the
    sandbox and its reward comes back."""
    client_env(tls_client_env(pki))

    async def go():
        async with EnvClient(mtls_services["env"].address) as env:
            assert await env.health() == "SERVING"
            episode, _ = await env.reset("code", SUM, seed=0)
            result = await env.step(episode, "coder", RIGHT)
            assert result.local_reward > 0, result.info

    asyncio.run(go())
    for proc in mtls_services.values():
        assert "mutual TLS, token required" in proc.log_text()


def test_plaintext_client_cannot_talk_to_a_tls_server(mtls_services, client_env):
    client_env({})  # no ATGRPO_TLS_*: a plaintext channel

    async def go():
        async with EnvClient(mtls_services["env"].address, timeout_s=3) as env:
            # retried, then given up
            with pytest.raises((errors.Unavailable, errors.DeadlineExceeded)):
                await env.list_envs()

    asyncio.run(go())


@pytest.mark.parametrize("who", ["no certificate", "a certificate from another CA"])
def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(mtls_services, pki, who):
    cert = {
        "no certificate": None,
        "a certificate from another CA": (pki.intruder_pem, pki.intruder_key),
    }[who]
    sec = ClientSecurity(
        ca=open(pki.ca_pem, "rb").read(),
        cert=open(cert[0], "rb").read() if cert else None,
        key=open(cert[1], "rb").read() if cert else None,
        token=TOKEN,
    )

    async def go():
        async with open_channel(mtls_services["sandbox"].address, security=sec) as ch:
            with pytest.raises(aio.AioRpcError) as err:
                await health(ch)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(go())


def test_a_client_that_does_not_trust_the_server_refuses_it(pki):
    """The client checks the server too: a server certificate from an unknown CA is refused."""

    async def go():
        running = await create_server(
            router_bindings(), security=ServerSecurity.from_files(pki.server_pem, pki.server_key)
        )
        try:
            rogue_ca = ClientSecurity(ca=open(pki.rogue_pem, "rb").read())
            async with open_channel(f"127.0.0.1:{running.port}", security=rogue_ca) as ch:
                with pytest.raises(aio.AioRpcError) as err:
                    await health(ch)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            trusted = ClientSecurity(ca=open(pki.ca_pem, "rb").read())
            async with open_channel(f"localhost:{running.port}", security=trusted) as ch:
                assert await health(ch) == "SERVING"
        finally:
            await running.stop(0)

    asyncio.run(go())


def test_tls_without_client_certificates_and_the_server_name_override(pki, client_env):
    """Server-only TLS: any client that trusts the CA connects; ATGRPO_TLS_SERVER_NAME checks the
    certificate against a name other than the address dialled."""

    async def go():
        running = await create_server(
            router_bindings(), security=server_security(pki, mutual=False, token=None)
        )
        try:
            client_env({"ATGRPO_TLS_CA": pki.ca_pem, "ATGRPO_TLS_SERVER_NAME": "localhost"})
            async with RouterClient(f"127.0.0.1:{running.port}") as c:
                assert (await c.get_info()).service == "router"
            client_env({"ATGRPO_TLS_SERVER_NAME": "not-in-the-certificate.example"})
            async with RouterClient(f"127.0.0.1:{running.port}", timeout_s=3) as c:
                # retried, then given up
                with pytest.raises((errors.Unavailable, errors.DeadlineExceeded)):
                    await c.get_info()
        finally:
            await running.stop(0)

    asyncio.run(go())


def test_plaintext_health_port_serves_probes_that_cannot_speak_tls(pki):
    async def go():
        running = await create_server(
            router_bindings(), security=server_security(pki), health_address="127.0.0.1:0"
        )
        try:
            async with aio.insecure_channel(f"127.0.0.1:{running.health_port}") as ch:
                assert await health(ch) == "SERVING"
                with pytest.raises(aio.AioRpcError) as err:  # the health check only, nothing else
                    await ch.unary_unary("/atgrpo.v1.RouterService/GetInfo")(b"", timeout=5)
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            async with aio.insecure_channel(f"127.0.0.1:{running.port}") as ch:
                with pytest.raises(aio.AioRpcError):
                    await health(ch)
        finally:
            await running.stop(0)

    asyncio.run(go())


def test_bad_settings_fail_with_a_message_naming_them(pki, tmp_path, client_env):
    with pytest.raises(SecurityConfigError, match="--tls-key"):
        ServerSecurity.from_files(pki.server_pem, None)
    with pytest.raises(SecurityConfigError, match="--tls-client-ca.*needs TLS"):
        ServerSecurity.from_files(None, None, pki.ca_pem)
    with pytest.raises(SecurityConfigError, match="--tls-cert='/nonexistent.pem': cannot read"):
        ServerSecurity.from_files("/nonexistent.pem", pki.server_key)
    client_env({"ATGRPO_TLS_CA": str(tmp_path / "missing.pem")})
    with pytest.raises(SecurityConfigError, match="ATGRPO_TLS_CA="):
        EnvClient("127.0.0.1:1")
    client_env({"ATGRPO_TLS_CA": pki.ca_pem, "ATGRPO_TLS_CERT": pki.client_pem})
    with pytest.raises(SecurityConfigError, match="ATGRPO_TLS_KEY"):
        EnvClient("127.0.0.1:1")


def test_a_service_with_a_bad_tls_flag_exits_naming_it(tmp_path, pki):
    with pytest.raises(AssertionError, match=r"--tls-key=.*cannot read"):
        start_service(
            "router",
            tmp_path,
            ["--tls-cert", pki.server_pem, "--tls-key", str(tmp_path / "nope.key")],
            {},
            timeout_s=60,
        )


def test_a_local_training_run_works_over_mutual_tls_with_the_token(pki, tiny_model, tmp_path):
    """`atgrpo train` in local mode with only the environment set: the launcher's five services
    serve mTLS and require the token, and every call between them (router -> env, rollout,
    trainer; rollout -> env; env -> sandbox; trainer -> rollout's LoadWeights) carries both."""
    config = (ROOT / "examples" / "toy_L1_tiny.yaml").read_text()
    config = config.replace("model_path: .atgrpo/models/tiny", f"model_path: {tiny_model}")
    config = config.replace("eval_every_steps: 25", "eval_every_steps: 0").replace(
        "tasks_per_step: 16", "tasks_per_step: 4"
    )
    (tmp_path / "run.yaml").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATGRPO_")}
    env |= tls_client_env(pki) | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
        "ATGRPO_TLS_SERVER_CERT": pki.server_pem,
        "ATGRPO_TLS_SERVER_KEY": pki.server_key,
        "ATGRPO_TLS_CLIENT_CA": pki.ca_pem,
        "ATGRPO_LOG_LEVEL": "DEBUG",
    }
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "atgrpo.cli",
            "train",
            str(tmp_path / "run.yaml"),
            "--steps",
            "1",
            "--run-dir",
            str(run_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run finished after step 1/1" in out.stdout
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if s.get("kind", "step") == "step"] == [1]
    logs = sorted((run_dir / "services" / "logs").iterdir())
    assert len(logs) == 5
    for log in logs:
        assert "mutual TLS, token required" in log.read_text(errors="replace"), log.name
    for path in [p for p in run_dir.rglob("*") if p.is_file()]:
        assert TOKEN.encode() not in path.read_bytes(), f"the token is in {path}"
    assert TOKEN not in out.stdout + out.stderr


def test_the_openai_http_port_takes_the_grpc_ports_mutual_tls_and_token(pki, tiny_model, tmp_path):
    """rollout_svc's --http-port serves with the same certificate, client CA and token as its gRPC
    port: a client with the CA, its certificate and the token is answered; one without a
    certificate, or in plaintext, never reaches a handler."""
    import ssl

    import httpx
    import openai

    flags = ["--tls-cert", pki.server_pem, "--tls-key", pki.server_key]
    flags += ["--tls-client-ca", pki.ca_pem, "--pool", f"tiny={tiny_model}", "--http-port", "0"]
    proc = start_service("rollout", tmp_path, flags, {"ATGRPO_AUTH_TOKEN": TOKEN})
    try:
        port = json.loads((tmp_path / "rollout.port.json").read_text())["http_port"]
        trusted = ssl.create_default_context(cafile=pki.ca_pem)
        mine = ssl.create_default_context(cafile=pki.ca_pem)
        mine.load_cert_chain(pki.client_pem, pki.client_key)

        def client(scheme: str, ctx: ssl.SSLContext) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=f"{scheme}://localhost:{port}/v1",
                api_key=TOKEN,
                max_retries=0,
                http_client=httpx.Client(verify=ctx, timeout=30),
            )

        assert [m.id for m in client("https", mine).models.list().data] == ["tiny"]
        for scheme, ctx in (("https", trusted), ("http", trusted)):
            with pytest.raises(openai.APIConnectionError):
                client(scheme, ctx).models.list()
    finally:
        proc.stop()

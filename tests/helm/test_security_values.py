"""The chart's `security` values, rendered and then used for real: a sandbox_svc started with the
environment and flags the chart gives the sandbox pod (the Secrets' files written where the pod
would mount them) serves TLS with mutual TLS and the token, and a client with the run Job's
environment reaches it, while the probes' plaintext health port answers without TLS."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo import errors
from atgrpo._proto.v1 import rollout_pb2, router_pb2, trainer_pb2
from atgrpo.rpc.security import ClientSecurity, open_channel
from atgrpo.rpc.server import LIVENESS
from sandbox_svc.client import SandboxClient
from tests.helm.conftest import component, of_kind, pod_spec, template
from tests.security.conftest import start_service
from tests.security.pki import _ca, _leaf

SECURE = ("--set", "security.tlsSecret=atgrpo-tls", "--set", "security.tokenSecret=atgrpo-token")
TOKEN = "chart-token-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def objs(helm) -> list[dict]:
    return template(*SECURE)


def _mounted(spec: dict, container: dict, secrets: Path) -> dict[str, str]:
    """The container's ATGRPO_* environment, with each Secret's mount path replaced by a local
    folder holding what the pod would find there."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    where = {
        m["mountPath"]: secrets / volumes[m["name"]]["secret"]["secretName"]
        for m in container["volumeMounts"]
        if "secret" in volumes.get(m["name"], {})
    }
    env = {}
    for e in container["env"]:
        if e["name"].startswith("ATGRPO_") and "value" in e:
            value = e["value"]
            for mount, local in where.items():
                value = value.replace(mount, str(local))
            env[e["name"]] = value
    return env


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> Path:
    """The two Secrets as a cert-manager Certificate and `kubectl create secret` would hold them:
    one certificate for the chart's serverName, usable as server and as client."""
    root = tmp_path_factory.mktemp("secrets")
    pki = root / "pki"
    pki.mkdir()
    _ca(pki, "ca")
    _leaf(
        pki,
        "pod",
        "ca",
        "atgrpo.internal",
        "subjectAltName=DNS:atgrpo.internal\n"
        "extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    tls, token = root / "atgrpo-tls", root / "atgrpo-token"
    tls.mkdir()
    token.mkdir()
    (tls / "ca.crt").write_bytes((pki / "ca.pem").read_bytes())
    (tls / "tls.crt").write_bytes((pki / "pod.pem").read_bytes())
    (tls / "tls.key").write_bytes((pki / "pod.key").read_bytes())
    (token / "token").write_text(TOKEN)
    return root


def test_every_pod_gets_the_secrets_and_probes_the_plaintext_health_port(objs):
    workloads = [
        o for kind in ("Deployment", "StatefulSet", "Job", "Pod") for o in of_kind(objs, kind)
    ]
    assert workloads
    for obj in workloads:
        spec = pod_spec(obj)
        # the sandbox neither serves a token-guarded RPC nor calls anyone: it never holds the token
        sandbox = component(obj) == "sandbox"
        for c in spec["containers"] + spec.get("initContainers", []):
            names = {e["name"] for e in c["env"]}
            assert {
                "ATGRPO_TLS_CA",
                "ATGRPO_TLS_CERT",
                "ATGRPO_TLS_KEY",
                "ATGRPO_TLS_SERVER_NAME",
            } <= names
            assert ("ATGRPO_AUTH_TOKEN_FILE" in names) != sandbox, (
                obj["metadata"]["name"],
                c["name"],
            )
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/etc/atgrpo/tls" in mounts and ("/etc/atgrpo/token" in mounts) != sandbox
        for c in spec["containers"]:
            if "livenessProbe" in c:
                health = next(p["containerPort"] for p in c["ports"] if p["name"] == "health")
                assert c["readinessProbe"]["grpc"] == {"port": health}
                assert c["livenessProbe"]["grpc"] == {"port": health, "service": LIVENESS}
                assert f"--health-port={health}" in c["args"]


def test_the_rendered_settings_secure_a_real_service(objs, secrets, tmp_path, monkeypatch):
    sandbox = next(
        o for o in of_kind(objs, "Deployment") if o["metadata"]["name"].endswith("-sandbox")
    )
    spec = pod_spec(sandbox)
    server_env = _mounted(spec, spec["containers"][0], secrets)
    job = of_kind(objs, "Job")[0]
    client_env = _mounted(pod_spec(job), pod_spec(job)["initContainers"][0], secrets)
    with socket.socket() as s:  # a free port for the health-only server
        s.bind(("127.0.0.1", 0))
        health_port = s.getsockname()[1]
    svc = start_service("sandbox", tmp_path, ["--health-port", str(health_port)], server_env)

    def as_the_job(env: dict[str, str]) -> None:
        for name in [k for k in os.environ if k.startswith("ATGRPO_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    async def go():
        # Through the TLS port that checks client certificates, as the run Job would.
        as_the_job(client_env)
        assert ClientSecurity.from_env().server_name == "atgrpo.internal"
        async with SandboxClient(svc.address) as client:
            assert (await client.execute("print(6 * 7)")).stdout == b"42\n"
        # Without a client certificate the same port refuses the handshake.
        as_the_job(
            {k: v for k, v in client_env.items() if k not in ("ATGRPO_TLS_CERT", "ATGRPO_TLS_KEY")}
        )
        async with SandboxClient(svc.address) as client:
            with pytest.raises(errors.Unavailable):
                await client.execute("print(1)", timeout_s=3)
        # The probes' port: the health check alone, in plaintext.
        async with open_channel(f"127.0.0.1:{health_port}", security=ClientSecurity()) as channel:
            resp = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert resp.status == health_pb2.HealthCheckResponse.SERVING

    try:
        asyncio.run(go())
    finally:
        svc.stop()


# ---- the token by default ------------------------------------------------------------------------

GENERATED = "rl-atgrpo-token"


def _pods(objs) -> list[dict]:
    return [o for kind in ("Deployment", "StatefulSet", "Job", "Pod") for o in of_kind(objs, kind)]


def _token_secrets(obj) -> set[str]:
    """The Secrets a pod's containers read ATGRPO_AUTH_TOKEN_FILE from (None: a container
    without)."""
    spec = pod_spec(obj)
    volumes = {v["name"]: v.get("secret", {}).get("secretName") for v in spec["volumes"]}
    found = set()
    for c in spec["containers"] + spec.get("initContainers", []):
        env = {e["name"]: e.get("value") for e in c["env"]}
        if "ATGRPO_AUTH_TOKEN_FILE" in env:
            [mount] = [
                m
                for m in c["volumeMounts"]
                if env["ATGRPO_AUTH_TOKEN_FILE"].startswith(m["mountPath"] + "/")
            ]
            found.add(volumes[mount["name"]])
        else:
            found.add(None)
    return found


def test_the_token_is_on_by_default(helm):
    """A default install generates the token and every pod but the sandbox uses it: the services
    require it, and the run Job (StartRun) and helm test send it."""
    objs = template()
    [secret] = [o for o in of_kind(objs, "Secret") if o["metadata"]["name"] == GENERATED]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48 and token.isalnum()
    for obj in _pods(objs):
        want = {None} if component(obj) == "sandbox" else {GENERATED}
        assert _token_secrets(obj) == want, obj["metadata"]["name"]
    assert {component(o) for o in _pods(objs)} == {
        "router",
        "env",
        "sandbox",
        "rollout",
        "trainer",
        "run",
        "test",
    }
    # `helm template` cannot look the installed Secret up: each render draws a fresh token (an
    # upgrade reads it back instead; docs/deploy.md, Security)
    again = [o for o in of_kind(template(), "Secret") if o["metadata"]["name"] == GENERATED]
    assert again[0]["data"]["token"] != secret["data"]["token"]
    assert "helm.sh/resource-policy" not in secret["metadata"].get("annotations", {})


@pytest.mark.parametrize(
    "values, secret",
    [
        (("--set", "security.tokenSecret=mine"), "mine"),
        (("--set", "security.tokenSecret=mine", "--set", "security.generateToken=false"), "mine"),
        (("--set", "security.generateToken=false"), None),
    ],
)
def test_own_token_secret_or_none(helm, values, secret):
    objs = template(*values)
    assert not [o for o in of_kind(objs, "Secret") if o["metadata"]["name"] == GENERATED]
    for obj in _pods(objs):
        assert _token_secrets(obj) == ({None} if component(obj) == "sandbox" else {secret}), obj[
            "metadata"
        ]["name"]


def _call(
    address: str, method: str, request, security: ClientSecurity, stream: bool
) -> grpc.StatusCode:
    async def go():
        async with open_channel(address, security=security) as channel:
            try:
                serialize = dict(request_serializer=lambda m: m.SerializeToString())
                if stream:
                    await channel.stream_unary(method, **serialize)(iter([request]), timeout=30)
                else:
                    await channel.unary_unary(method, **serialize)(request, timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    return asyncio.run(go())


def test_a_default_install_refuses_unauthenticated_weights_training_and_runs(
    helm, tmp_path, tiny_model
):
    """Real router, trainer and rollout processes with the environment a default install gives
    their pods (the generated Secret's token where the pod mounts it): LoadWeights, Train and
    StartRun without the token fail UNAUTHENTICATED; the run Job's environment gets past the door.
    tests/security/test_auth.py checks every guarded RPC in depth (nothing changes when refused)."""
    objs = template()
    [secret] = [o for o in of_kind(objs, "Secret") if o["metadata"]["name"] == GENERATED]
    secrets = tmp_path / "secrets"
    (secrets / GENERATED).mkdir(parents=True)
    (secrets / GENERATED / "token").write_bytes(base64.b64decode(secret["data"]["token"]))
    job = of_kind(objs, "Job")[0]
    as_the_job = ClientSecurity.from_env(
        _mounted(pod_spec(job), pod_spec(job)["containers"][0], secrets)
    )
    assert as_the_job.token
    calls = {
        "router": (
            [],
            "/atgrpo.v1.RouterService/StartRun",
            router_pb2.StartRunRequest(config_yaml="run: {}"),
            False,
        ),
        "trainer": (
            ["--pool=main"],
            "/atgrpo.v1.TrainerService/Train",
            trainer_pb2.TrainRequest(
                header=trainer_pb2.TrainHeader(run_id="r", step=1, num_samples=0)
            ),
            True,
        ),
        "rollout": (
            [f"--pool=main={tiny_model}", "--engine=hf", "--device=cpu", "--dtype=float32"],
            "/atgrpo.v1.RolloutService/LoadWeights",
            rollout_pb2.WeightChunk(header=rollout_pb2.WeightHeader(pool="main", version=1)),
            True,
        ),
    }
    for kind, (args, method, request, stream) in calls.items():
        [obj] = [
            o for o in objs if o["kind"] in ("Deployment", "StatefulSet") and component(o) == kind
        ]
        spec = pod_spec(obj)
        env = _mounted(spec, spec["containers"][0], secrets)
        assert env["ATGRPO_AUTH_TOKEN_FILE"] == str(secrets / GENERATED / "token")
        svc = start_service(kind, tmp_path, args, env)
        try:
            assert (
                _call(svc.address, method, request, ClientSecurity(), stream)
                == grpc.StatusCode.UNAUTHENTICATED
            )
            assert _call(svc.address, method, request, as_the_job, stream) not in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.OK,
            ), kind
        finally:
            svc.stop()

"""The chart's pods, rendered with its defaults and each helm/atgrpo/ci/ file: native gRPC probes
on every server, every container locked down (the sandbox's and the env's relaxations only what
they need), and a disruption budget for every workload."""

from __future__ import annotations

from atgrpo.rpc.server import LIVENESS
from tests.helm.chart_objects import server_workloads
from tests.helm.conftest import (
    FULLNAME,
    component,
    named,
    of_kind,
    pod_labels,
    pod_spec,
    template,
    values_of,
)

# ---- probes, security, disruption budgets --------------------------------------------------


def test_every_server_container_has_native_grpc_probes(case):
    _, objs = case
    for obj in server_workloads(objs):
        for c in pod_spec(obj)["containers"]:
            # With TLS on, the probes (which cannot speak it) ask the plaintext health-only port.
            names = {p["name"] for p in c["ports"]}
            port = next(
                p["containerPort"]
                for p in c["ports"]
                if p["name"] == ("health" if "health" in names else "grpc")
            )
            where = f"{obj['metadata']['name']}/{c['name']}"
            # Ready once built (its models loaded); alive as soon as it answers, so a load of any
            # length is neither killed nor sent traffic (atgrpo.rpc.server.LIVENESS).
            assert c["readinessProbe"]["grpc"] == {"port": port}, where
            assert c["livenessProbe"]["grpc"] == {"port": port, "service": LIVENESS}, where
            # pods that import torch before listening get a startup probe, so liveness spares them
            if component(obj) in ("rollout", "trainer"):
                assert c["startupProbe"]["grpc"] == {"port": port, "service": LIVENESS}
                assert (
                    c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"]
                    >= 300
                )


def test_every_container_is_locked_down(case):
    _, objs = case
    for obj in objs:
        spec = pod_spec(obj)
        if spec is None:
            continue
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            where = f"{obj['metadata']['name']}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "privileged" not in sc and "add" not in sc["capabilities"], where
            assert c.get("resources", {}).get("requests"), f"{where} has no resource requests"
        if component(obj) not in ("sandbox", "env"):  # both relaxed, below
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_sandbox_security_settings(case):
    values_file, objs = case
    sandbox = named(objs, "Deployment", f"{FULLNAME}-sandbox")
    spec = pod_spec(sandbox)
    assert spec["hostUsers"] is False  # uid 0..65535 of the pod map to unprivileged host ids
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsUser"] != 0
    [c] = spec["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    # relaxed for bwrap's nested namespaces only, never more
    assert sc["procMount"] == "Unmasked"
    assert sc["seccompProfile"] == {"type": "Unconfined"} and sc["appArmorProfile"] == {
        "type": "Unconfined"
    }
    assert "--backend=bwrap" in c["args"] and "--unsafe-no-isolation" not in c["args"]
    runtime = values_of(values_file)["sandbox"]["runtimeClassName"]
    assert spec.get("runtimeClassName", "") == runtime
    assert c["resources"]["limits"]["cpu"] and c["resources"]["limits"]["memory"]


def test_env_pods_relax_only_what_the_scorer_seal_takes(case):
    _, objs = case
    spec = pod_spec(named(objs, "Deployment", f"{FULLNAME}-env"))
    # unshare and mount for reasoning_gym's sealed scorer calls, in the pod's own user namespace
    assert spec["hostUsers"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert "seccompProfile" not in spec["securityContext"]
    [c] = spec["containers"]
    sc = c["securityContext"]
    assert sc["seccompProfile"] == {"type": "Unconfined"} == sc["appArmorProfile"]
    assert "procMount" not in sc and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True


def test_without_the_scorer_seal_env_pods_keep_the_runtime_defaults(helm):
    spec = pod_spec(
        named(template("--set", "env.scorerSeal=false"), "Deployment", f"{FULLNAME}-env")
    )
    assert "hostUsers" not in spec
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "seccompProfile" not in spec["containers"][0]["securityContext"]


def test_every_workload_has_a_matching_disruption_budget(case):
    values_file, objs = case
    budgets = of_kind(objs, "PodDisruptionBudget")
    for obj in server_workloads(objs):
        labels = pod_labels(obj)
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, obj["metadata"]["name"]
        want = 0 if component(obj) in ("router", "trainer") else 1
        assert matching[0]["spec"]["maxUnavailable"] == want
    assert len(budgets) == len(server_workloads(objs))

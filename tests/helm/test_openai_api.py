"""openaiApi: the rollout replicas' OpenAI-compatible HTTP port in the chart. Off by default;
on, every replica serves it with --http-port on ports.openai, its pods and Service name the port,
the NetworkPolicy admits openaiApi.from on it and nothing else does."""

from __future__ import annotations

import kubernetes_validate
import yaml

from tests.helm.conftest import CHART, RELEASE, named, of_kind, rendered, template

FULLNAME = f"{RELEASE}-atgrpo"
FRAMEWORK = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}


def _render(tmp_path, values: dict) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return template("-f", str(path))


def _rollout(objs) -> tuple[dict, dict, dict]:
    """(container, Service, NetworkPolicy) of the main pool's rollout replicas."""
    name = f"{FULLNAME}-rollout-main"
    sts = named(objs, "StatefulSet", name)
    return (
        sts["spec"]["template"]["spec"]["containers"][0],
        named(objs, "Service", name),
        named(objs, "NetworkPolicy", name),
    )


def _openai_rules(policy: dict) -> list[dict]:
    return [
        r
        for r in policy["spec"].get("ingress", [])
        if {"port": "openai", "protocol": "TCP"} in r.get("ports", [])
    ]


def test_off_by_default(helm, tmp_path):
    container, service, policy = _rollout(_render(tmp_path, {}))
    assert not [a for a in container["args"] if a.startswith("--http-port")]
    assert "openai" not in {p["name"] for p in container["ports"]}
    assert "openai" not in {p["name"] for p in service["spec"]["ports"]}
    assert _openai_rules(policy) == []


def test_on_every_replica_serves_it_and_only_the_named_peers_reach_it(helm, tmp_path, service_help):
    objs = _render(
        tmp_path,
        {"ports": {"openai": 8100}, "openaiApi": {"enabled": True, "from": [FRAMEWORK]}},
    )
    container, service, policy = _rollout(objs)
    assert "--http-port=8100" in container["args"]
    assert "--http-port" in service_help["rollout_svc"]
    assert {"name": "openai", "containerPort": 8100, "protocol": "TCP"} in container["ports"]
    assert {
        "name": "openai",
        "port": 8100,
        "targetPort": "openai",
        "protocol": "TCP",
        "appProtocol": "http",
    } in service["spec"]["ports"]
    assert _openai_rules(policy) == [
        {"from": [FRAMEWORK], "ports": [{"port": "openai", "protocol": "TCP"}]}
    ]
    # no other service opens it
    others = [p for p in of_kind(objs, "NetworkPolicy") if p is not policy]
    assert not any(_openai_rules(p) for p in others)
    for obj in (named(objs, "StatefulSet", f"{FULLNAME}-rollout-main"), service, policy):
        kubernetes_validate.validate(obj, "1.30", strict=True)


def test_on_without_peers_opens_no_rule(helm, tmp_path):
    _, _, policy = _rollout(_render(tmp_path, {"openaiApi": {"enabled": True}}))
    assert _openai_rules(policy) == []  # a rule without `from` would admit everyone


def test_the_tls_case_serves_it_over_https():
    objs = rendered(str(CHART / "ci" / "tls-values.yaml"))
    container, service, policy = _rollout(objs)
    assert "--http-port=8000" in container["args"]
    assert {p["name"]: p.get("appProtocol") for p in service["spec"]["ports"]}["openai"] == "https"
    assert _openai_rules(policy) == []

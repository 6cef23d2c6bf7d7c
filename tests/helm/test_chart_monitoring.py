"""The chart's monitoring: off by default; when on, a ServiceMonitor over every Service's metrics
port, a dashboard ConfigMap per helm/atgrpo/dashboards/ file and a PrometheusRule of every
helm/atgrpo/rules/ file, or a PodMonitor over every workload instead."""

from __future__ import annotations

import json

import jsonschema
import yaml

from tests.helm.conftest import CHART, WORKLOADS, component, of_kind, pod_labels, rendered, template
from tests.helm.crd_schemas import SCHEMAS

# ---- monitoring ------------------------------------------------------------------------------

MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_monitoring_is_off_by_default(helm):
    objs = rendered(None)
    assert not MONITORING_KINDS & {o["kind"] for o in objs}
    assert not [
        o for o in of_kind(objs, "ConfigMap") if "grafana_dashboard" in o["metadata"]["labels"]
    ]


def test_monitoring_objects(helm):
    objs = rendered(str(CHART / "ci" / "monitoring-values.yaml"))
    [sm] = of_kind(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = sm["spec"]["selector"]["matchLabels"]
    services = of_kind(objs, "Service")
    assert all(selector.items() <= s["metadata"]["labels"].items() for s in services)
    assert all(any(p["name"] == "metrics" for p in s["spec"]["ports"]) for s in services)
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    # one dashboard ConfigMap per file: the observability work only adds JSON files
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    dashboards = [
        o
        for o in of_kind(objs, "ConfigMap")
        if o["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert sorted(k for d in dashboards for k in d["data"]) == files
    for d in dashboards:
        assert d["metadata"]["namespace"] == "monitoring"
        for name, text in d["data"].items():
            assert json.loads(text) == json.loads((CHART / "dashboards" / name).read_text())
    # the PrometheusRule holds the groups of every rules/*.yaml, unchanged
    [rule] = of_kind(objs, "PrometheusRule")
    groups = [
        g
        for p in sorted((CHART / "rules").glob("*.yaml"))
        for g in yaml.safe_load(p.read_text())["groups"]
    ]
    assert rule["spec"]["groups"] == groups and groups


def test_pod_monitor_alternative(helm):
    objs = template("--set", "monitoring.podMonitor.enabled=true")
    [pm] = of_kind(objs, "PodMonitor")
    jsonschema.validate(pm, SCHEMAS["PodMonitor"])
    selector = pm["spec"]["selector"]["matchLabels"]
    scraped = [
        o for o in objs if o["kind"] in WORKLOADS and selector.items() <= pod_labels(o).items()
    ]
    assert sorted(component(o) for o in scraped) == [
        "env",
        "rollout",
        "router",
        "sandbox",
        "trainer",
    ]

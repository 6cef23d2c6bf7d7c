"""Rollout replicas scaled by Kubernetes (issue 39, item 2): a pool's HorizontalPodAutoscaler or
KEDA ScaledObject targets its StatefulSet (which then leaves the count to it), replicas being
removed drain, and bad settings fail the render saying what to set. Every object of the
ci/autoscale-values.yaml case is also validated strictly by test_chart.py."""

from __future__ import annotations

import jsonschema
import pytest

from tests.helm.conftest import (
    CHART,
    NAMESPACE,
    RELEASE,
    HelmError,
    named,
    of_kind,
    pod_spec,
    rendered,
    template,
)
from tests.helm.crd_schemas import SCHEMAS

AUTOSCALE = str(CHART / "ci" / "autoscale-values.yaml")
KEDA_API = "keda.sh/v1alpha1/ScaledObject"
FULLNAME = f"{RELEASE}-atgrpo"


def sts(objs, pool: str) -> dict:
    return named(objs, "StatefulSet", f"{FULLNAME}-rollout-{pool}")


def test_each_pool_s_hpa_targets_its_statefulset_which_leaves_it_the_count(helm):
    objs = rendered(AUTOSCALE)
    hpas = {h["metadata"]["name"]: h["spec"] for h in of_kind(objs, "HorizontalPodAutoscaler")}
    assert set(hpas) == {f"{FULLNAME}-rollout-coder", f"{FULLNAME}-rollout-tester"}
    coder, tester = hpas[f"{FULLNAME}-rollout-coder"], hpas[f"{FULLNAME}-rollout-tester"]
    assert coder["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": sts(objs, "coder")["metadata"]["name"],
    }
    assert (coder["minReplicas"], coder["maxReplicas"]) == (1, 8)
    assert (tester["minReplicas"], tester["maxReplicas"]) == (2, 4)
    [busy], [queue] = coder["metrics"], tester["metrics"]
    # the recording rule atgrpo_rollout_busy_fraction, and the gauge every replica exports
    assert busy["pods"]["metric"]["name"] == "atgrpo_rollout_busy_fraction"
    assert busy["pods"]["target"] == {"type": "AverageValue", "averageValue": "0.8"}
    assert queue["pods"]["metric"]["name"] == "atgrpo_rollout_requests_waiting"
    assert coder["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    for pool in ("coder", "tester"):
        assert "replicas" not in sts(objs, pool)["spec"]  # a helm upgrade keeps the HPA's count
    # defaults: a fixed count, no autoscaler
    plain = rendered(None)
    assert not of_kind(plain, "HorizontalPodAutoscaler")
    assert sts(plain, "main")["spec"]["replicas"] == 1


def test_the_busy_fraction_the_hpa_reads_is_recorded_per_pod():
    import yaml

    rules = yaml.safe_load((CHART / "rules" / "atgrpo.rules.yaml").read_text())
    recorded = {
        r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r
    }
    expr = recorded["atgrpo_rollout_busy_fraction"]
    assert "rate(atgrpo_rollout_busy_seconds_total[1m])" in expr and "pod" in expr


def test_a_replica_being_removed_drains_before_it_is_killed(helm):
    objs = rendered(AUTOSCALE)
    for pool, drain in (("coder", 300), ("tester", 120)):
        spec = pod_spec(sts(objs, pool))
        [c] = spec["containers"]
        # the flag itself is checked against rollout_svc's parser by test_chart_run.py
        assert f"--grace-s={drain}" in c["args"]
        assert spec["terminationGracePeriodSeconds"] == drain + 30


def test_keda_renders_a_scaled_object_where_its_crds_are(helm, tmp_path):
    values = tmp_path / "keda.yaml"
    values.write_text(
        "pools:\n  main:\n    rollout:\n      autoscale:\n"
        "        {mode: keda, maxReplicas: 6, metric: queue, target: 4,"
        " prometheusAddress: 'http://prometheus-operated.monitoring.svc:9090'}\n"
    )
    objs = template("-f", str(values), "--api-versions", KEDA_API)
    [so] = of_kind(objs, "ScaledObject")
    jsonschema.validate(so, SCHEMAS["ScaledObject"])
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == f"{FULLNAME}-rollout-main"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 6)
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "4"
    assert trigger["metadata"]["query"] == (
        f'sum(atgrpo_rollout_requests_waiting{{namespace="{NAMESPACE}", '
        f'pod=~"{FULLNAME}-rollout-main-[0-9]+"}})'
    )
    assert not of_kind(objs, "HorizontalPodAutoscaler")
    with pytest.raises(HelmError, match="this cluster has no KEDA"):
        template("-f", str(values))


@pytest.mark.parametrize(
    "autoscale, message",
    [
        ("{mode: hpa, target: 0.8}", r"maxReplicas is not set"),
        ("{mode: hpa, minReplicas: 3, maxReplicas: 2, target: 0.8}", r"1 <= minReplicas"),
        ("{mode: hpa, maxReplicas: 4}", r"target is not set"),
        ("{mode: hpa, maxReplicas: 4, metric: tokens, target: 1}", r"metric"),
        ("{mode: vpa, maxReplicas: 4, target: 1}", r"mode"),
    ],
)
def test_bad_autoscale_settings_fail_saying_what_to_set(helm, tmp_path, autoscale, message):
    values = tmp_path / "bad.yaml"
    values.write_text(f"pools:\n  main:\n    rollout:\n      autoscale: {autoscale}\n")
    with pytest.raises(HelmError, match=message):
        template("-f", str(values))

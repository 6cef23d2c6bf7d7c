"""The chart, rendered with its defaults and each helm/atgrpo/ci/ file, is valid Kubernetes:
`helm lint --strict` passes, every object validates strictly against the oldest and the newest
Kubernetes schemas (custom objects against tests/helm/crd_schemas.py), and every name fits
Kubernetes' limits. The objects a platform engineer would check by hand are checked beside it:
test_chart_pools.py (GPUs, trainers, replicas), test_chart_security.py (probes, the sandbox,
disruption budgets), test_chart_run.py (the run config's addresses, the run Job, the helm test,
the commands each container runs) and test_chart_monitoring.py."""

from __future__ import annotations

import json
import re
from functools import cache

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest

from tests.helm.conftest import (
    BASE_VALUES,
    CHART,
    CI_VALUES,
    FULLNAME,
    named,
    of_kind,
    rendered,
    run_helm,
)
from tests.helm.crd_schemas import SCHEMAS, pod_templates

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas known.
KUBE_VERSIONS = ("1.30", "1.37")


# ---- lint and schema validity ------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_passes_strict(helm, values):
    # a ci/ file alone (it sets its own registry, so `helm install -f` it works as it is)
    out = run_helm("lint", "--strict", str(CHART), "-f", str(values or BASE_VALUES))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_ci_files_cover_the_issue_cases():
    assert {p.name for p in CI_VALUES} == {
        "autoscale-values.yaml",
        "cpu-values.yaml",
        "l3-two-gpu-pools-values.yaml",
        "l2-lora-values.yaml",
        "monitoring-values.yaml",
        "tls-values.yaml",
        "models-populate-values.yaml",
        "math-datasets-values.yaml",
        "code-datasets-values.yaml",
        "multinode-trainer-values.yaml",
    }


@pytest.fixture(scope="module")
def k8s_validate():
    """kubernetes_validate.validate, with each schema file parsed once instead of once per
    object."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            kubernetes_validate.utils,
            "schema_contents",
            cache(kubernetes_validate.utils.schema_contents),
        )
        yield kubernetes_validate.validate


def test_every_object_validates_strictly(case, k8s_validate):
    _, objs = case
    problems = []
    for obj in [*objs, *(t for o in objs for t in pod_templates(o))]:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in SCHEMAS:
            errors = sorted(
                jsonschema.Draft202012Validator(SCHEMAS[obj["kind"]]).iter_errors(obj), key=str
            )
            problems += [f"{where}: {'.'.join(map(str, e.path))}: {e.message}" for e in errors]
            continue
        for version in KUBE_VERSIONS:
            try:
                k8s_validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(
                    f"{where} (k8s {version}): {'.'.join(map(str, e.path))}: {e.message}"
                )
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(
                    f"{where}: no schema for {obj['apiVersion']} {obj['kind']}: add one to "
                    f"crd_schemas.py"
                )
    assert not problems, "\n".join(problems)


def test_strict_validation_rejects_an_unknown_field(k8s_validate):
    objs = rendered(None)
    deployment = json.loads(json.dumps(named(objs, "Deployment", f"{FULLNAME}-router")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpcc"] = {"port": 1}
    with pytest.raises(kubernetes_validate.ValidationError, match="'grpcc' was unexpected"):
        k8s_validate(deployment, KUBE_VERSIONS[0], strict=True)
    monitor = json.loads(
        json.dumps(
            of_kind(rendered(str(CHART / "ci" / "monitoring-values.yaml")), "ServiceMonitor")[0]
        )
    )
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError, match="'intervall' was unexpected"):
        jsonschema.validate(monitor, SCHEMAS["ServiceMonitor"])


def test_names_fit_kubernetes_limits(case):
    for obj in case[1]:
        name = obj["metadata"]["name"]
        limit = 52 if obj["kind"] == "StatefulSet" else 63  # + "-<revision hash>" on pod labels
        assert len(name) <= limit, f"{obj['kind']} {name} is longer than {limit}"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name

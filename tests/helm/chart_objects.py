"""What the chart's tests (test_chart.py, test_chart_pools.py, test_chart_security.py and
test_chart_run.py) read off the rendered objects: the release's object names and cluster DNS
domain, the workloads that serve gRPC, and the run config the chart hands the run Job."""

from __future__ import annotations

import yaml

from tests.helm.conftest import NAMESPACE, of_kind

DOMAIN = f"{NAMESPACE}.svc.cluster.local"


def server_workloads(objs) -> list[dict]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet")]


def run_config(objs) -> dict:
    cms = [o for o in of_kind(objs, "ConfigMap") if "run.yaml" in o.get("data", {})]
    assert len(cms) == 1
    return yaml.safe_load(cms[0]["data"]["run.yaml"])

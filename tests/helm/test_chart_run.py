"""The run the chart starts, rendered with its defaults and each helm/atgrpo/ci/ file: a run
config atgrpo accepts that points at the chart's services, the Job that trains with it (a new Job
whenever its pod would change), the helm test pod, the notes, and the commands each container
runs (checked against the services' and the CLI's own parsers)."""

from __future__ import annotations

import pytest

from atgrpo.cli import build_parser
from atgrpo.config import parse_config
from tests.helm.chart_objects import DOMAIN, run_config, server_workloads
from tests.helm.conftest import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    component,
    named,
    of_kind,
    pod_labels,
    pod_spec,
    pod_template,
    pool_workload,
    pools_of,
    rendered,
    run_helm,
    template,
    values_of,
)

# ---- the run: config, Job, helm test ------------------------------------------------------


def _service_for(objs, sts: dict) -> dict:
    if sts["kind"] == "LeaderWorkerSet":  # the trainer's Service; LWS labels its leader pod so
        svc = named(objs, "Service", sts["metadata"]["name"].removesuffix("-nodes"))
        labels = {**pod_labels(sts), "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    else:
        svc = named(objs, "Service", sts["spec"]["serviceName"])
        labels = pod_labels(sts)
    assert svc["spec"]["clusterIP"] == "None"  # headless: a DNS record per pod
    assert svc["spec"]["selector"].items() <= labels.items()
    return svc


def test_run_config_is_valid_and_points_at_the_services(case):
    values_file, objs = case
    data = run_config(objs)
    cfg = parse_config(data, source="the chart's run config")  # atgrpo's own validation
    assert not cfg.local_mode
    port = values_of(values_file)["ports"]["grpc"]
    for kind in ("router", "env", "sandbox"):
        svc = named(objs, "Service", f"{FULLNAME}-{kind}")
        assert getattr(cfg.services, kind) == f"{svc['metadata']['name']}.{DOMAIN}:{port}"
        assert {"name": "grpc", "port": port}.items() <= svc["spec"]["ports"][0].items()
    pools = pools_of(values_of(values_file))
    assert set(cfg.pools) == set(pools)
    for pool, v in pools.items():
        sts = named(objs, "StatefulSet", f"{FULLNAME}-rollout-{pool}")
        svc = _service_for(objs, sts)
        # every ready replica behind the headless Service, as they come and go
        assert svc["spec"]["clusterIP"] == "None"
        assert list(cfg.services.rollout[pool]) == [
            f"dns:///{svc['metadata']['name']}.{DOMAIN}:{port}"
        ]
        assert cfg.pools[pool].rollout_replicas == v["rollout"]["replicas"]
        assert cfg.pools[pool].model_path == v["modelPath"]
        assert cfg.pools[pool].device == ("cuda" if v["rollout"]["gpus"] else "cpu")
        if v["trainable"]:
            trainer = pool_workload(objs, "trainer", pool)
            tsvc = _service_for(objs, trainer)
            pod = f"{trainer['metadata']['name']}-0."
            if trainer["kind"] == "LeaderWorkerSet":  # its Service lists the leader alone
                pod = ""
            assert cfg.services.trainer[pool] == f"{pod}{tsvc['metadata']['name']}.{DOMAIN}:{port}"
    assert cfg.run.run_dir == f"/data/runs/{cfg.run.name}"


@pytest.mark.parametrize(
    "values, level",
    [
        (None, "L1"),
        ("cpu-values.yaml", "L1"),
        ("l2-lora-values.yaml", "L2"),
        ("l3-two-gpu-pools-values.yaml", "L3"),
    ],
)
def test_level_follows_the_pools(helm, values, level):
    objs = rendered(str(CHART / "ci" / values) if values else None)
    assert parse_config(run_config(objs)).level == level


def test_small_floats_stay_numbers_in_the_run_config():
    data = run_config(rendered(str(CHART / "ci" / "l3-two-gpu-pools-values.yaml")))
    # Go writes 1e-06, which YAML 1.1 reads as text
    assert data["pools"]["planner"]["optim"]["lr"] == 1e-6


def test_run_job_trains_with_the_config_map(case):
    _, objs = case
    [job] = [j for j in of_kind(objs, "Job") if component(j) == "run"]
    spec = pod_spec(job)
    [c] = spec["containers"]
    assert c["args"] == ["atgrpo", "train", "/config/run.yaml", "--connect"]
    args = build_parser().parse_args(c["args"][1:])
    assert args.connect and str(args.config) == "/config/run.yaml"
    config_volume = next(v for v in spec["volumes"] if v["name"] == "config")
    cm = named(objs, "ConfigMap", config_volume["configMap"]["name"])
    assert "run.yaml" in cm["data"]
    assert {"name": "config", "mountPath": "/config", "readOnly": True} in c["volumeMounts"]
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    # the config hash in the name: a new config is a new Job, never an edit of an immutable one
    assert job["metadata"]["name"] == cm["metadata"]["name"]
    # the run's owners restart with a new config (then resume), so their pods carry its hash
    digest = job["spec"]["template"]["metadata"]["annotations"]["checksum/run-config"]
    for obj in server_workloads(objs):
        annotations = pod_template(obj)["metadata"].get("annotations", {})
        assert (annotations.get("checksum/run-config") == digest) == (
            component(obj) in ("router", "trainer")
        )
    [wait] = spec["initContainers"]
    script = wait["command"][2]
    assert script.startswith("atgrpo config check /config/run.yaml")
    assert f"--address router={FULLNAME}-router.{DOMAIN}:" in script


def test_helm_test_pod_checks_every_service_and_replica(case):
    values_file, objs = case
    pods = of_kind(objs, "Pod")
    [pod] = pods
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [c] = pod["spec"]["containers"]
    args = build_parser().parse_args(c["args"][1:])
    assert args.fn.__name__ == "_cmd_status"
    cfg = parse_config(run_config(objs))
    s = cfg.services
    port = values_of(values_file)["ports"]["grpc"]
    want = [("router", s.router), ("env", s.env), ("sandbox", s.sandbox)]
    pools = pools_of(values_of(values_file))
    for pool in sorted(cfg.pools):
        sts = named(objs, "StatefulSet", f"{FULLNAME}-rollout-{pool}")
        host = f"{_service_for(objs, sts)['metadata']['name']}.{DOMAIN}"
        # an autoscaled pool (no fixed count) runs at least minReplicas
        count = sts["spec"].get("replicas", pools[pool]["rollout"]["autoscale"]["minReplicas"])
        want += [("rollout", f"{sts['metadata']['name']}-{i}.{host}:{port}") for i in range(count)]
        want += [("trainer", s.trainer[pool])] if pool in s.trainer else []
    assert [tuple(a.split("=", 1)) for a in args.address] == want


def test_notes_render(helm):
    out = run_helm(
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--namespace",
        NAMESPACE,
        "-f",
        str(CHART / "ci" / "l3-two-gpu-pools-values.yaml"),
    )
    notes = out[out.index("NOTES:") :]
    assert "2 agents (planner, coder) on 2 pool(s), specialisation L3" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes


def _run_job(*value_args: str) -> dict:
    [job] = [j for j in of_kind(template(*value_args), "Job") if component(j) == "run"]
    return job


def test_what_changes_the_run_pod_makes_a_new_job():
    """A Job's pod template is immutable: `helm upgrade` with anything that changes it (the config,
    the image, the token) under the same Job name would fail, so each such change is a new name;
    what the run pod does not see (the sandbox's replicas) keeps it."""
    base = _run_job()
    assert _run_job()["metadata"]["name"] == base["metadata"]["name"]
    assert _run_job("--set", "sandbox.replicas=5")["metadata"]["name"] == base["metadata"]["name"]
    for change in (
        "run.config.run.steps=7",
        "images.cpu.tag=0.1.1",
        "security.tokenSecret=mine",
        "security.generateToken=false",
        "run.resources.limits.memory=3Gi",
    ):
        job = _run_job("--set", change)
        assert job["metadata"]["name"] != base["metadata"]["name"], change


# ---- the commands the containers run -----------------------------------------------------


def _module_and_flags(args: list[str]) -> tuple[str, list[str]]:
    m = (
        args.index("-m", args.index("torch.distributed.run") + 1)
        if "torch.distributed.run" in args
        else args.index("-m")
    )
    return args[m + 1], [a.split("=", 1)[0] for a in args[m + 2 :] if a.startswith("--")]


def test_container_flags_exist_in_the_services(case, service_help):
    _, objs = case
    for obj in server_workloads(objs):
        for c in pod_spec(obj)["containers"]:
            module, flags = _module_and_flags(c["args"])
            assert module in service_help, (
                f"{obj['metadata']['name']} runs an unknown module {module}"
            )
            missing = [f for f in flags if f not in service_help[module]]
            assert not missing, f"{obj['metadata']['name']}: python -m {module} has no {missing}"


def test_build_tiny_model_init_uses_the_cli():
    objs = rendered(str(CHART / "ci" / "cpu-values.yaml"))
    for comp in ("rollout", "trainer"):
        spec = named(objs, "StatefulSet", f"{FULLNAME}-{comp}-main")["spec"]["template"]["spec"]
        [init] = spec["initContainers"]
        assert init["args"] == ["atgrpo", "model", "tiny", "--out", "/models/tiny"]
        args = build_parser().parse_args(init["args"][1:])
        assert str(args.out) == "/models/tiny"
        assert {"name": "models", "emptyDir": {"sizeLimit": "1Gi"}} in spec["volumes"]

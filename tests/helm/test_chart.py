"""The chart, rendered with its defaults and each helm/atgrpo/ci/ file: valid Kubernetes, and
the objects a platform engineer would check by hand (GPUs, trainers, probes, the sandbox, the
run config's addresses, the commands each container runs)."""

from __future__ import annotations

import json
import re
from functools import cache

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from atgrpo.cli import build_parser
from atgrpo.config import parse_config
from atgrpo.rpc.server import LIVENESS
from tests.helm.conftest import (
    BASE_VALUES,
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    WORKLOADS,
    HelmError,
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
from tests.helm.crd_schemas import SCHEMAS, pod_templates

GPU = "nvidia.com/gpu"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas known.
KUBE_VERSIONS = ("1.30", "1.37")
FULLNAME = f"{RELEASE}-atgrpo"
DOMAIN = f"{NAMESPACE}.svc.cluster.local"


def containers(spec: dict) -> list[dict]:
    return spec["containers"]


def server_workloads(objs) -> list[dict]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet")]


def run_config(objs) -> dict:
    cms = [o for o in of_kind(objs, "ConfigMap") if "run.yaml" in o.get("data", {})]
    assert len(cms) == 1
    return yaml.safe_load(cms[0]["data"]["run.yaml"])


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


# ---- pools: GPUs, trainers, replicas -----------------------------------------------------------


def test_gpus_are_requested_by_gpu_pools_only(case):
    values_file, objs = case
    pools = pools_of(values_of(values_file))
    seen = set()
    for obj in objs:
        spec = pod_spec(obj)
        if spec is None:
            continue
        labels = pod_labels(obj)
        pool, comp = labels.get("atgrpo.dev/pool"), labels["app.kubernetes.io/component"]
        want = int(pools[pool][comp]["gpus"]) if pool and comp in ("rollout", "trainer") else 0
        if obj["kind"] == "LeaderWorkerSet":  # a trainer past one node: the GPUs of one node
            want //= obj["spec"]["leaderWorkerTemplate"]["size"]
        for c in spec["containers"] + spec.get("initContainers", []):
            res = c.get("resources", {})
            got = {k: int(res.get(k, {}).get(GPU, 0)) for k in ("requests", "limits")}
            expected = want if c in spec["containers"] else 0  # init containers build models on CPU
            assert got == {"requests": expected, "limits": expected}, (
                f"{obj['metadata']['name']}/{c['name']}"
            )
        if want:
            seen.add((pool, comp))
            assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
            assert {"name": "shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
            image = spec["containers"][0]["image"]
            assert f"atgrpo-{comp}-gpu:" in image, image
        else:
            assert GPU not in json.dumps(spec.get("tolerations", [])), obj["metadata"]["name"]
            assert "-gpu:" not in spec["containers"][0]["image"]
    assert seen == {
        (p, c) for p, v in pools.items() for c in ("rollout", "trainer") if int(v[c]["gpus"]) > 0
    }


def test_cpu_profile_requests_no_gpu_anywhere(helm):
    text = json.dumps(rendered(str(CHART / "ci" / "cpu-values.yaml")))
    assert GPU not in text
    assert "atgrpo-rollout-gpu" not in text and "atgrpo-trainer-gpu" not in text


def test_one_trainer_per_trainable_pool_and_rollouts_per_pool(case):
    values_file, objs = case
    pools = pools_of(values_of(values_file))
    sets = of_kind(objs, "StatefulSet")
    trainers = {
        o["metadata"]["labels"]["atgrpo.dev/pool"]: o
        for o in sets + of_kind(objs, "LeaderWorkerSet")
        if component(o) == "trainer"
    }
    rollouts = {
        o["metadata"]["labels"]["atgrpo.dev/pool"]: o for o in sets if component(o) == "rollout"
    }
    assert sorted(trainers) == sorted(p for p, v in pools.items() if v["trainable"])
    assert sorted(rollouts) == sorted(pools)
    # never two for a pool
    assert len([o for o in objs if component(o) == "trainer" and pod_spec(o)]) == len(trainers)
    for pool, sts in trainers.items():
        assert sts["spec"]["replicas"] == 1
        if sts["kind"] == "LeaderWorkerSet":  # one claim, every node's pods mount it
            claim = named(objs, "PersistentVolumeClaim", f"{FULLNAME}-trainer-{pool}-data")
            size = claim["spec"]["resources"]["requests"]["storage"]
        else:
            claims = sts["spec"]["volumeClaimTemplates"]
            assert [c["metadata"]["name"] for c in claims] == ["data"]
            size = claims[0]["spec"]["resources"]["requests"]["storage"]
        assert size == pools[pool]["trainer"]["checkpoints"]["size"]
        mounts = pod_spec(sts)["containers"][0]["volumeMounts"]
        assert {"name": "data", "mountPath": "/data"} in mounts
    for pool, sts in rollouts.items():
        # an autoscaled pool's count is its autoscaler's (test_chart_autoscale.py)
        fixed = pools[pool]["rollout"]["autoscale"]["mode"] == "off"
        want = pools[pool]["rollout"]["replicas"] if fixed else None
        assert sts["spec"].get("replicas") == want
        assert sts["spec"]["podManagementPolicy"] == "Parallel"


def test_trainer_with_several_gpus_runs_one_rank_per_gpu():
    objs = rendered(str(CHART / "ci" / "l3-two-gpu-pools-values.yaml"))
    coder = named(objs, "StatefulSet", f"{FULLNAME}-trainer-coder")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert coder["args"][:8] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "trainer_svc",
        "--host=0.0.0.0",
    ]
    planner = named(objs, "StatefulSet", f"{FULLNAME}-trainer-planner")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert planner["args"][:3] == ["python", "-m", "trainer_svc"]


def test_a_trainer_past_one_node_is_a_leader_worker_set_of_one_pod_per_node():
    objs = rendered(str(CHART / "ci" / "multinode-trainer-values.yaml"))
    name = f"{FULLNAME}-trainer-main"
    assert not [o for o in of_kind(objs, "StatefulSet") if o["metadata"]["name"] == name]
    lws = named(objs, "LeaderWorkerSet", f"{name}-nodes")["spec"]
    assert lws["replicas"] == 1 and lws["leaderWorkerTemplate"]["size"] == 2  # 16 GPUs / 8
    leader = lws["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    worker = lws["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    # static rendezvous at the leader, node rank = LWS's worker index: global rank 0, which
    # serves gRPC, is on the leader, the one pod the Service lists
    launch = [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=$(LWS_WORKER_INDEX)",
        "--master-addr=$(LWS_LEADER_ADDRESS)",
        "--master-port=29500",
        "--nproc-per-node=8",
        "-m",
        "trainer_svc",
    ]
    for spec in (leader, worker):
        (c,) = spec["containers"]
        assert c["args"][: len(launch)] == launch and "--pool=main" in c["args"]
        assert c["resources"]["limits"][GPU] == 8
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        ]
        assert f"{name}-data" in claims
    assert "readinessProbe" in leader["containers"][0] and "ports" in leader["containers"][0]
    assert (
        "readinessProbe" not in worker["containers"][0] and "ports" not in worker["containers"][0]
    )
    pvc = named(objs, "PersistentVolumeClaim", f"{name}-data")["spec"]
    assert pvc["accessModes"] == ["ReadWriteMany"] and pvc["storageClassName"] == "nfs-client"
    service = named(objs, "Service", name)["spec"]
    assert service["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert run_config(objs)["services"]["trainer"]["main"] == f"{name}.{DOMAIN}:50051"
    # the nodes reach each other on any port (rendezvous, NCCL); the router only on gRPC
    ingress = named(objs, "NetworkPolicy", name)["spec"]["ingress"]
    peers = [r for r in ingress if "ports" not in r]
    assert [
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers[0]["from"]
    ] == ["trainer"]


@pytest.mark.parametrize(
    "gpus, modes, why",
    [
        (
            "12",
            "{ReadWriteMany}",
            r"trainer.gpus is 12, more than a node's 8 \(gpu.perNode\) and not a multiple"
            r".*Set gpus to 8 or 16",
        ),
        (
            "16",
            "{ReadWriteOnce}",
            r"runs on 2 nodes.*set pools.main.trainer.checkpoints.accessModes to \[ReadWriteMany\]",
        ),
    ],
)
def test_a_trainer_past_one_node_that_cannot_work_is_refused(gpus, modes, why):
    with pytest.raises(HelmError, match=why):
        template(
            "--set",
            f"pools.main.trainer.gpus={gpus}",
            "--set",
            f"pools.main.trainer.checkpoints.accessModes={modes}",
        )


def test_frozen_pool_has_rollouts_but_no_trainer(helm):
    objs = template(
        "--set",
        "pools.policy.modelPath=/models/a",
        "--set",
        "pools.judge.modelPath=/models/b",
        "--set",
        "pools.judge.trainable=false",
        "--set",
        "pools.judge.engine=hf",
        "--set",
        "pools.judge.rollout.gpus=0",
        "--set",
        "run.config.agents.tool.pool=policy",
        "--set",
        "run.config.agents.plan.pool=judge",
    )
    sets = {o["metadata"]["name"] for o in of_kind(objs, "StatefulSet")}
    assert sets == {
        f"{FULLNAME}-rollout-policy",
        f"{FULLNAME}-trainer-policy",
        f"{FULLNAME}-rollout-judge",
    }
    cfg = parse_config(run_config(objs))
    assert not cfg.pools["judge"].trainable and cfg.pools["judge"].device == "cpu"
    assert set(cfg.services.trainer) == {"policy"}
    judge = named(objs, "StatefulSet", f"{FULLNAME}-rollout-judge")["spec"]["template"]["spec"]
    assert judge["containers"][0]["image"].split("/")[-1].startswith("atgrpo-cpu:")
    assert GPU not in json.dumps(judge)


def test_pool_scheduling_reaches_its_pods():
    objs = rendered(str(CHART / "ci" / "l3-two-gpu-pools-values.yaml"))
    for pool, node_pool in (("planner", "a100"), ("coder", "h100")):
        for comp in ("rollout", "trainer"):
            spec = named(objs, "StatefulSet", f"{FULLNAME}-{comp}-{pool}")["spec"]["template"][
                "spec"
            ]
            assert spec["nodeSelector"] == {"atgrpo.dev/gpu-pool": node_pool}
            assert {
                "key": "atgrpo.dev/gpu-pool",
                "operator": "Exists",
                "effect": "NoSchedule",
            } in spec["tolerations"]
    rollout = named(objs, "StatefulSet", f"{FULLNAME}-rollout-planner")["spec"]["template"]["spec"]
    assert "podAntiAffinity" in rollout["affinity"]
    assert (
        "affinity"
        not in named(objs, "StatefulSet", f"{FULLNAME}-trainer-planner")["spec"]["template"]["spec"]
    )


def test_lora_pool_serves_adapters():
    objs = rendered(str(CHART / "ci" / "l2-lora-values.yaml"))
    args = named(objs, "StatefulSet", f"{FULLNAME}-rollout-shared")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--pool=shared=/models/Qwen3-1.7B:lora" in args
    assert "--engine=vllm" in args
    volumes = named(objs, "StatefulSet", f"{FULLNAME}-rollout-shared")["spec"]["template"]["spec"][
        "volumes"
    ]
    assert {
        "name": "models",
        "nfs": {"server": "nfs.example.internal", "path": "/exports/models", "readOnly": True},
    } in volumes


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

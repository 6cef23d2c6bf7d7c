"""The chart's pools, rendered with its defaults and each helm/atgrpo/ci/ file: GPUs requested by
GPU pools only, one trainer per trainable pool and the rollout replicas of each, a trainer with
several GPUs or past one node, frozen pools, pool scheduling and LoRA pools."""

from __future__ import annotations

import json

import pytest

from atgrpo.config import parse_config
from tests.helm.chart_objects import DOMAIN, run_config
from tests.helm.conftest import (
    CHART,
    FULLNAME,
    HelmError,
    component,
    named,
    of_kind,
    pod_labels,
    pod_spec,
    pools_of,
    rendered,
    template,
    values_of,
)

GPU = "nvidia.com/gpu"


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

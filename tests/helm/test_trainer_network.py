"""A trainer past one node (a LeaderWorkerSet): the NCCL settings of gpu.multiNode.nccl as env
(none unless set), the RDMA device resource and the IPC_LOCK capability only where
gpu.multiNode.rdma.enabled, and the allocator's expandable segments on every GPU trainer."""

from __future__ import annotations

import pytest

from tests.helm.conftest import CHART, RELEASE, HelmError, named, of_kind, pod_spec, template

MULTINODE = str(CHART / "ci" / "multinode-trainer-values.yaml")
TRAINER = f"{RELEASE}-atgrpo-trainer-main"
ALLOC = {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}
RDMA_ON = [
    "--set",
    "gpu.multiNode.rdma.enabled=true",
    "--set",
    "gpu.multiNode.rdma.resourceName=rdma/hca_shared",
    "--set",
    "gpu.multiNode.nccl.socketIfname=eth0",
    "--set",
    "gpu.multiNode.nccl.ibHca=mlx5_0\\,mlx5_1",
    "--set",
    "gpu.multiNode.nccl.netGdrLevel=PHB",
    "--set",
    "gpu.multiNode.nccl.ibGidIndex=3",
    "--set",
    "gpu.multiNode.nccl.extraEnv[0].name=NCCL_IB_TC",
    "--set-string",
    "gpu.multiNode.nccl.extraEnv[0].value=106",
]


def node_pods(objs) -> list[dict]:
    """The leader's and the workers' pod specs of the trainer's LeaderWorkerSet."""
    lws = named(objs, "LeaderWorkerSet", f"{TRAINER}-nodes")["spec"]["leaderWorkerTemplate"]
    return [lws["leaderTemplate"]["spec"], lws["workerTemplate"]["spec"]]


def test_by_default_a_multinode_trainer_sets_no_nccl_env_no_rdma_and_adds_no_capability(helm):
    objs = template("-f", MULTINODE)
    for spec in node_pods(objs):
        (c,) = spec["containers"]
        assert not [e for e in c["env"] if e["name"].startswith("NCCL_")]
        assert ALLOC in c["env"]
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert set(c["resources"]["limits"]) == {"memory", "ephemeral-storage", "nvidia.com/gpu"}
        # past one node auto means hsdp (trainer_svc.sharding.resolve)
        assert "--sharding=auto" in c["args"]


def test_rdma_and_nccl_values_reach_every_node_and_only_the_multinode_trainer(helm):
    objs = template("-f", MULTINODE, *RDMA_ON)
    for spec in node_pods(objs):
        (c,) = spec["containers"]
        nccl = {e["name"]: e["value"] for e in c["env"] if e["name"].startswith("NCCL_")}
        assert nccl == {
            "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_IB_HCA": "mlx5_0,mlx5_1",
            "NCCL_NET_GDR_LEVEL": "PHB",
            "NCCL_IB_GID_INDEX": "3",
            "NCCL_IB_TC": "106",
        }
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        for side in ("requests", "limits"):
            assert c["resources"][side]["rdma/hca_shared"] == 1
            assert c["resources"][side]["nvidia.com/gpu"] == 8
        assert c["resources"]["requests"]["memory"] == "32Gi"  # the pool's own requests kept
    # the rollout replicas (one GPU, one node) get none of it
    for sts in of_kind(objs, "StatefulSet"):
        for c in pod_spec(sts)["containers"]:
            assert "add" not in c["securityContext"]["capabilities"]
            assert "rdma/hca_shared" not in c.get("resources", {}).get("limits", {})
            assert not [e for e in c.get("env", []) if e["name"].startswith("NCCL_")]


def test_a_trainer_on_one_node_ignores_the_multinode_network(helm):
    objs = template(*RDMA_ON)  # the defaults: one GPU trainer, one node
    (c,) = pod_spec(named(objs, "StatefulSet", TRAINER))["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not [e for e in c["env"] if e["name"].startswith("NCCL_")]
    assert ALLOC in c["env"]


def test_a_cpu_trainer_gets_no_cuda_allocator_setting(helm):
    objs = template("-f", str(CHART / "ci" / "cpu-values.yaml"))
    (c,) = pod_spec(named(objs, "StatefulSet", TRAINER))["containers"]
    assert ALLOC["name"] not in {e["name"] for e in c["env"]}


def test_the_schema_refuses_a_gdr_level_nccl_does_not_know(helm):
    with pytest.raises(HelmError, match="netGdrLevel"):
        template("-f", MULTINODE, "--set", "gpu.multiNode.nccl.netGdrLevel=NEAR")

"""Bounded storage: every emptyDir has a size limit, every container ephemeral-storage requests
and limits that cover them, with defaults sized from the code's own figures (atgrpo.memory): the
rollout's /tmp holds a weight swap of every example model, the checkpoint volume the checkpoints
a run keeps."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from atgrpo.cli.sizing import checkpoints_at_once, size_run
from atgrpo.config import parse_config
from atgrpo.memory import checkpoint_bytes
from atgrpo.model_shape import load_shape
from tests.helm.conftest import FULLNAME, ROOT, named, pod_spec, rendered, template, values_of
from tests.helm.storage_objects import pods, rejected, run_config

GIB = 1024**3
UNITS = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": GIB,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "m": 1e-3,
}


def quantity(q) -> float:
    """A Kubernetes quantity in bytes."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)", str(q))
    assert m and m.group(2) in UNITS, f"{q!r} is not a quantity"
    return float(m.group(1)) * UNITS[m.group(2)]


# ---- bounded storage -----------------------------------------------------------------------


def test_every_emptydir_is_bounded_and_every_container_has_ephemeral_storage(case):
    _, objs = case
    assert pods(objs)
    for name, spec in pods(objs):
        disk = 0.0
        for v in spec.get("volumes", []):
            if "emptyDir" in v:
                assert "sizeLimit" in (v["emptyDir"] or {}), (
                    f"{name}: emptyDir {v['name']} has no sizeLimit"
                )
                if v["emptyDir"].get("medium") != "Memory":
                    disk += quantity(v["emptyDir"]["sizeLimit"])
        for c in spec["containers"] + spec.get("initContainers", []):
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                assert "ephemeral-storage" in res.get(kind, {}), (
                    f"{name}/{c['name']}: no ephemeral-storage {kind}"
                )
            assert quantity(res["requests"]["ephemeral-storage"]) <= quantity(
                res["limits"]["ephemeral-storage"]
            )
        # the kubelet evicts a pod whose emptyDirs and containers use more than its containers'
        # limits added up: they must cover every disk-backed emptyDir filled to its limit
        limit = sum(
            quantity(c["resources"]["limits"]["ephemeral-storage"]) for c in spec["containers"]
        )
        assert disk <= limit, (
            f"{name}: emptyDirs may hold {disk / GIB:.1f} GiB, limit {limit / GIB:.1f} GiB"
        )


def example_disks():
    """(example, atgrpo plan's disk figures) of every pool of examples/*_gpu.yaml whose model
    atgrpo knows the shape of."""
    out = []
    for path in sorted((ROOT / "examples").glob("*_gpu.yaml")):
        cfg = parse_config(yaml.safe_load(path.read_text()), source=str(path))
        out += [(path.name, cfg.pools[d.pool].model_path, d) for d in size_run(cfg).disk]
    return out


def test_rollout_tmp_holds_a_weight_swap_of_every_example_model():
    """A vLLM replica writes each full-weight push into a new model-* directory under /tmp and
    deletes the old one once the new one serves: two copies during a swap (atgrpo plan's
    replica_disk), plus compile caches."""
    defaults = values_of(None)["poolDefaults"]["rollout"]
    disks = example_disks()
    assert {Path(model).name for _, model, _ in disks} >= {"Qwen3-1.7B", "Qwen3-8B"}
    caches = 4 * GIB
    for example, _, d in disks:
        assert quantity(defaults["tmpSize"]) >= d.replica_disk + caches, (
            f"{example} pool {d.pool}: {(d.replica_disk + caches) / GIB:.1f} GiB"
        )
    assert max(d.replica_disk for _, _, d in disks) == 2 * max(d.push for _, _, d in disks)


def test_checkpoint_volume_holds_the_kept_checkpoints_of_the_default_model():
    """(keep_checkpoints + the best + the one being written) x one checkpoint
    (state.PoolState.save), as atgrpo plan counts them, for the default run and for any longer
    one."""
    cfg = run_config(rendered(None))
    size = quantity(values_of(None)["poolDefaults"]["trainer"]["checkpoints"]["size"])
    [d] = size_run(cfg).disk
    assert 20 * GIB < d.checkpoint < 25 * GIB  # Qwen3-1.7B: 1.72 B parameters x 14 bytes under bf16
    assert size >= d.trainer_volume
    longer = dataclasses.replace(cfg.run, steps=10_000)
    assert checkpoints_at_once(longer) == cfg.run.keep_checkpoints + 2 == 5
    assert size >= checkpoints_at_once(longer) * d.checkpoint
    # a LoRA checkpoint is its adapters: far smaller
    pool = cfg.pools["main"]
    lora = dataclasses.replace(pool, specialization="lora")
    assert checkpoint_bytes(load_shape(pool.model_path), lora, agents=2) < d.checkpoint / 50


def test_an_ephemeral_limit_below_the_emptydirs_is_refused(helm, tmp_path):
    error = rejected(tmp_path, {"router": {"persistence": {"enabled": False}}})
    assert (
        "router.resources.limits.ephemeral-storage: 2Gi is below what the pod's emptyDirs may "
        "hold, /tmp 1Gi + data 10Gi = 11.0Gi, so the kubelet would evict the pod before they fill. "
        "Raise it to at least 12Gi"
    ) in error
    error = rejected(tmp_path, {"poolDefaults": {"rollout": {"tmpSize": "60Gi"}}})
    assert "pools.main.rollout.resources.limits.ephemeral-storage: 41Gi is below" in error
    error = rejected(tmp_path, {"env": {"resources": {"limits": {"ephemeral-storage": None}}}})
    assert (
        "env.resources.limits.ephemeral-storage: not set, so the pod could fill its node's disk"
        in error
    )
    error = rejected(tmp_path, {"models": {"volume": {"emptyDir": {}}}})
    assert re.search(
        r"volume models of pools\.main\.(rollout|trainer): an emptyDir without sizeLimit could "
        r"fill its node's disk\. Give it one",
        error,
    )


def test_a_limit_that_covers_the_emptydirs_is_accepted(helm, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "router": {
                    "persistence": {"enabled": False},
                    "resources": {"limits": {"ephemeral-storage": "12Gi"}},
                }
            }
        )
    )
    router = pod_spec(named(template("-f", str(path)), "Deployment", f"{FULLNAME}-router"))
    assert {"name": "data", "emptyDir": {"sizeLimit": "10Gi"}} in router["volumes"]

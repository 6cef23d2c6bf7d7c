"""Hybrid sharding (hsdp): a pool past one node shards within each node and replicates across
nodes, on a 2-D (replicate, shard) mesh. Which layout `auto` picks, the refusal of a forced hsdp
on nodes of unequal sizes, and one update over gloo ranks split into simulated nodes that equals
flat FSDP's."""

import subprocess

import pytest
import torch

from atgrpo.rpc.main import SettingsError
from tests.conftest import ROOT
from tests.trainer.dist_worker import SIMULATED_PER_NODE
from tests.trainer.test_distributed import torchrun_args, torchrun_env, update_mismatches
from trainer_svc.settings import TrainerSettings
from trainer_svc.sharding import mesh_shape, resolve


@pytest.mark.parametrize(
    "sharding, world, per_node, lora, layout",
    [
        ("auto", 8, 8, False, "fsdp"),  # one node: flat
        ("auto", 16, 8, False, "hsdp"),  # two nodes: hybrid
        ("auto", 2, 1, False, "hsdp"),
        ("auto", 12, 8, False, "fsdp"),  # unequal nodes: no 2-D mesh, flat
        ("fsdp", 16, 8, False, "fsdp"),  # forced flat past one node
        ("hsdp", 8, 8, False, "hsdp"),  # forced hybrid on one node: (1, 8), flat in effect
        ("auto", 16, 8, True, "ddp"),  # LoRA pools replicate
        ("hsdp", 16, 8, True, "ddp"),
        ("auto", 1, 1, False, "none"),
    ],
)
def test_auto_shards_hybrid_past_one_node(sharding, world, per_node, lora, layout):
    assert resolve(sharding, world, lora, per_node) == layout


def test_the_mesh_is_nodes_by_ranks_per_node():
    assert mesh_shape("hsdp", 16, 8) == (2, 8)
    assert mesh_shape("fsdp", 16, 8) == (16,)


def test_a_forced_hsdp_on_unequal_nodes_is_refused_naming_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="--sharding fsdp"):
        resolve("hsdp", 12, False, 8)
    import argparse

    ap = argparse.ArgumentParser()
    TrainerSettings.add_flags(ap)
    monkeypatch.setenv("WORLD_SIZE", "12")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with pytest.raises(SettingsError, match="same number of ranks"):
        TrainerSettings.from_args(ap.parse_args(["--sharding", "hsdp"]))
    assert TrainerSettings.from_args(ap.parse_args(["--sharding", "auto"])).sharding == "auto"


def run_worker(tiny_model, out, sharding: str, nproc: int, per_node: int) -> dict:
    worker = str(ROOT / "tests" / "trainer" / "dist_worker.py")
    # mini-batches of 5 and 3 rows, one per micro-batch: ranks run unequal numbers of them
    run = subprocess.run(
        [*torchrun_args(nproc), worker, tiny_model, str(out), sharding, "5", "12"],
        env={**torchrun_env(), SIMULATED_PER_NODE: str(per_node)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("nproc, per_node", [(2, 1), (4, 2)])
def test_hsdp_over_simulated_nodes_updates_as_flat_fsdp(tiny_model, tmp_path, nproc, per_node):
    flat = run_worker(tiny_model, tmp_path / "flat.pt", "fsdp", nproc, per_node)
    hybrid = run_worker(tiny_model, tmp_path / "hybrid.pt", "hsdp", nproc, per_node)
    assert flat["mesh"] == ((nproc,), ["S(0)"])
    assert hybrid["mesh"] == ((nproc // per_node, per_node), ["R", "S(0)"])
    from tests.trainer.test_update import load

    before = load(tiny_model).state_dict()
    assert set(hybrid["state"]) == set(before)
    assert update_mismatches(before, flat["state"], hybrid["state"]) == []
    assert any(not torch.equal(hybrid["state"][k], before[k]) for k in before)  # it did update
    for k in ("loss", "grad_norm"):
        assert hybrid["metrics"][k] == pytest.approx(flat["metrics"][k], rel=1e-5), k

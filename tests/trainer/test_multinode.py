"""A trainer pool over two "nodes" on loopback: two torchrun launchers of one rank each, joined by
the static rendezvous the chart renders for a trainer past one node (helm/atgrpo/templates/
_trainer_nodes.tpl: --nnodes, --node-rank, --master-addr at the leader), gloo on the CPU. Node 0's
rank serves gRPC; one update and its checkpoint equal a single process's on the same samples. Past
one node `--sharding auto` is hsdp (sharding.resolve): here a (2 nodes, 1 rank) mesh, its sharded
checkpoint and its gathered push included."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import psutil
import pytest
import torch

from tests.trainer.test_distributed import free_port
from tests.trainer.test_multirank_service import (
    ADAM_ATOL,
    UPDATE,
    one_process,
    start_trainer,
    wait_for_port_file,
)
from tests.trainer.test_trainer_service import pool_spec
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.client import TrainerClient


def launcher(node_rank: int, port: int, port_file) -> subprocess.Popen:
    """One node's torchrun, as the chart's LeaderWorkerSet pods run it (one GPU-less rank)."""
    return start_trainer(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--nproc-per-node=1",
        ],
        port_file,
    )


def test_a_pool_over_two_nodes_trains_like_one_process(tiny_model, tmp_path):
    samples = on_policy_samples(load(tiny_model), seed=1)
    port, port_file = free_port(), tmp_path / "port.json"
    nodes = [launcher(rank, port, port_file) for rank in (0, 1)]
    try:
        served = wait_for_port_file(nodes[0], port_file)

        async def drive():
            async with TrainerClient(f"127.0.0.1:{served['port']}") as t:
                info = await t.setup(pool_spec(tiny_model), timeout_s=60)
                assert info.service.details["ranks"] == "2" and info.version == 0
                resp = await t.train("run1", 1, 0, samples, update=UPDATE, timeout_s=60)
                saved = await t.save_checkpoint(str(tmp_path / "ckpt"), timeout_s=60)
                return resp, saved

        resp, saved = asyncio.run(drive())
        # the server is node 0's launcher's child: global rank 0 is on the leader node
        assert served["pid"] in {c.pid for c in psutil.Process(nodes[0].pid).children()}
        os.kill(served["pid"], signal.SIGTERM)  # rank 0 stops serving, then stops node 1's rank
        outs = [n.communicate(timeout=60)[0] for n in nodes]
        assert [n.returncode for n in nodes] == [0, 0], [o[-2000:] for o in outs]
        assert "rank 1: stopped" in outs[1]
    finally:
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, signal.SIGKILL)
                n.wait()

    from transformers import AutoModelForCausalLM

    [(ref, one)] = one_process(tiny_model, [samples])
    assert (resp.version, saved.version) == (1, 1)
    assert resp.metrics["loss"] == pytest.approx(ref.metrics["loss"], abs=1e-6)
    assert resp.metrics["grad_norm"] == pytest.approx(ref.metrics["grad_norm"], rel=1e-5)
    two = AutoModelForCausalLM.from_pretrained(f"{saved.path}/model").state_dict()
    before = load(tiny_model).state_dict()
    for k in one:
        assert not torch.equal(one[k], before[k]) or "rotary" in k, k
        assert torch.allclose(two[k], one[k], rtol=0, atol=ADAM_ATOL), k

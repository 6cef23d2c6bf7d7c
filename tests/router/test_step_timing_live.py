"""A step's time breakdown from real services in this process: env_svc, rollout_svc (the hf engine
on the tiny model) and trainer_svc over loopback gRPC, driven by the router's RunLoop for one step.
The step record says where its time went (docs/observability.md, "A step's time"), in parts that fit
inside the phases the router timed itself, and the same fields survive WatchRun's wire."""

from __future__ import annotations

import asyncio
import math

import pytest

from atgrpo.cli.report import step_line, tensorboard_scalars
from atgrpo.config import parse_config
from atgrpo.contract import run_wire
from atgrpo.contract.run import STEP_TIMING
from atgrpo.contract.trainer import MISMATCH_KEYS
from atgrpo.rpc.server import create_server
from env_svc.client import EnvClient
from env_svc.server import bindings as env_bindings
from env_svc.settings import EnvSettings
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings as rollout_bindings
from router_svc.loop import RunLoop
from trainer_svc.server import bindings as trainer_bindings


def config(run_dir, model: str, env: str, rollout: str, trainer: str):
    sampling = {"temperature": 1.0, "max_tokens": 6}
    return parse_config(
        {
            "run": {
                "name": "timing",
                "seed": 0,
                "steps": 1,
                "tasks_per_step": 4,
                "eval_every_steps": 0,
                "checkpoint_every_steps": 0,
                "checkpoint_at_start": False,
                "run_dir": str(run_dir),
            },
            "env": {"name": "toy", "turn_order": ["speaker", "listener"], "max_turns": 2},
            "pools": {
                "a": {
                    "model_path": model,
                    "device": "cpu",
                    "dtype": "float32",
                    "optim": {"lr": 5e-4, "warmup_steps": 0},
                }
            },
            "agents": {
                a: {"pool": "a", "train_sampling": sampling} for a in ("speaker", "listener")
            },
            "algorithm": {"k": 4, "mini_batch_size": 64},
            "services": {
                "env": env,
                "sandbox": "127.0.0.1:9",
                "router": "127.0.0.1:9",
                "rollout": {"a": [rollout]},
                "trainer": {"a": trainer},
            },
        }
    )


def one_step(model: str, run_dir) -> dict:
    async def go():
        env = await create_server(env_bindings(EnvSettings()))
        env_address = f"127.0.0.1:{env.port}"
        envs = EnvClient(env_address)
        replica = Replica({"a": PoolRuntime("a", HFEngine(model, device="cpu", dtype="float32"))})
        rollout = await create_server(rollout_bindings(replica, envs))
        trainer = await create_server(trainer_bindings())
        loop = None
        try:
            cfg = config(
                run_dir,
                model,
                env_address,
                f"127.0.0.1:{rollout.port}",
                f"127.0.0.1:{trainer.port}",
            )
            loop = RunLoop(cfg)
            await loop.prepare()
            await loop.pipeline.run(1)
            return loop.dir.read_events()[-1]
        finally:
            if loop is not None:
                await loop.clients.close()
            await envs.close()
            for server in (trainer, rollout, env):
                await server.stop(0)

    return asyncio.run(go())


def test_a_step_says_where_its_time_went(tiny_model, tmp_path):
    e = one_step(tiny_model, tmp_path / "run")

    for k in (
        "time_prefill_s",
        "time_decode_s",
        "time_env_s",
        "time_wait_s",
        "time_forward_s",
        "time_backward_s",
        "time_optimizer_s",
        "gen_flops_per_s",
        "gen_mfu",
        "gen_matmul_flops_per_s",
        "update_flops_per_s",
        "update_mfu",
        "update_matmul_flops_per_s",
    ):
        assert e[k] >= 0, k
    # Generation ran (a prefill and a decode loop), and its parts fit in the collection's wall time.
    assert e["time_prefill_s"] > 0 and e["time_decode_s"] > 0 and e["time_env_s"] > 0
    gen = e["time_prefill_s"] + e["time_decode_s"]
    assert gen + e["time_env_s"] <= e["rollout_seconds"] + 1e-6
    assert e["time_wait_s"] == pytest.approx(e["rollout_seconds"] - gen - e["time_env_s"], abs=1e-9)
    # 4 tasks x up to 2 turns x 2 agents, one n=4 generation each: prompts once, 1-6 tokens per
    # sample.
    assert 8 <= e["decode_tokens"] / 4 <= 4 * 2 * 2 * 6
    assert e["prefill_tokens"] > 0
    # The update's parts fit in the training phase (the router's own clock around the Train RPC).
    pool = e["pools"]["a"]
    update = e["time_forward_s"] + e["time_backward_s"] + e["time_optimizer_s"]
    assert e["time_forward_s"] > 0 and e["time_backward_s"] > 0 and e["time_optimizer_s"] > 0
    assert update <= pool["train_seconds"] + 1e-6 <= e["train_seconds"] + 0.05
    # Every sample's prompt and response went through one forward with gradient (one epoch).
    assert e["update_tokens"] > pool["tokens"] > 0
    # Rates: FLOPs over the compute seconds, and their share of this process's measured matmul rate.
    assert e["gen_mfu"] > 0 and e["update_mfu"] > 0
    assert e["gen_mfu"] == pytest.approx(e["gen_flops_per_s"] / e["gen_matmul_flops_per_s"])
    assert e["update_mfu"] == pytest.approx(
        e["update_flops_per_s"] / e["update_matmul_flops_per_s"]
    )
    assert pool["update_flops"] == pytest.approx(e["update_flops_per_s"] * update)

    # The step record has the engine's log-probs against the trainer's (issue 59): the hf engine
    # and the trainer run the same float32 model on CPU, so the ratios sit near 1.
    mm = pool["mismatch"]
    assert tuple(mm) == MISMATCH_KEYS and all(math.isfinite(v) for v in mm.values())
    assert 0 <= mm["mismatch_outside_support"] <= 1 and 0 <= mm["mismatch_capped_fraction"] <= 1
    assert mm["mismatch_ratio_p05"] <= mm["mismatch_ratio_p50"] <= mm["mismatch_ratio_p95"]
    assert mm["mismatch_ratio_p50"] == pytest.approx(1.0, abs=0.05) and mm["mismatch_kl"] >= 0

    # WatchRun carries the breakdown, so `atgrpo train --timing` and TensorBoard see it.
    back = run_wire.event_from_pb(run_wire.event_to_pb("r", e))
    assert {k: back[k] for k in STEP_TIMING} == pytest.approx({k: e[k] for k in STEP_TIMING})
    assert "| gen " in step_line(back, 1, timing=True) and "| gen " not in step_line(back, 1)
    tags = tensorboard_scalars(back)
    assert (
        tags["time/prefill_s"] == pytest.approx(e["time_prefill_s"]) and tags["perf/update_mfu"] > 0
    )

"""The toy run the end-to-end tests train (`toy_config`: the toy env on a given model, at any level
L0-L3), a reporter that keeps a run's events (`Collect`), and running one on local services, as
`atgrpo train` does, to its end (`train_locally`) or to a step (`stop_after_step`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from atgrpo.cli.runner import LocalServices, drive, run_until
from atgrpo.config import parse_config
from atgrpo.discovery import listed_now
from rollout_svc.client import RolloutClient

K = 4


class Collect:
    """A reporter that keeps the events (drive() reports to it as the CLI's Reporter would)."""

    def __init__(self):
        self.status, self.events = None, []

    def start(self, status):
        self.status = status

    def on_event(self, event):
        self.events.append(event)


def toy_config(run_dir: Path, model: str, level: str, *, steps: int = 2, **run) -> dict:
    agents = ["speaker"] if level == "L0" else ["speaker", "listener"]
    pools = {
        "a": {
            "model_path": model,
            "device": "cpu",
            "dtype": "float32",
            "optim": {"lr": 5e-4, "warmup_steps": 0},
        }
    }
    if level == "L2":
        pools["a"].update(specialization="lora", optim={"lr": 3e-3, "warmup_steps": 0})
    if level == "L3":
        pools["b"] = dict(pools["a"])
    pool_of = {"speaker": "a", "listener": "b" if level == "L3" else "a"}
    sampling = {"temperature": 1.0, "max_tokens": 4}
    return {
        "run": {
            "name": f"e2e-{level.lower()}",
            "seed": 0,
            "steps": steps,
            "tasks_per_step": 4,
            "eval_every_steps": 0,
            "eval_tasks": 4,
            "checkpoint_every_steps": 0,
            "save_samples": True,
            "run_dir": str(run_dir),
            **run,
        },
        "env": {"name": "toy", "turn_order": agents, "max_turns": 2},
        "pools": pools,
        "agents": {
            a: {"pool": pool_of[a], "train_sampling": sampling, "eval_sampling": {"max_tokens": 4}}
            for a in agents
        },
        "algorithm": {"k": K, "mini_batch_size": 64},
    }


async def served_versions(cfg) -> dict[tuple[str, str], int]:
    out = {}
    for targets in cfg.services.rollout.values():
        for address in listed_now(targets):
            async with RolloutClient(address) as client:
                out.update({(p.pool, p.adapter): p.version for p in await client.policies()})
    return out


def train_locally(data: dict) -> tuple[Collect, dict]:
    """Run to the end; returns the events and what the replicas serve before they stop."""
    cfg = parse_config(data)
    sink = Collect()
    with LocalServices(cfg) as running:
        final = asyncio.run(drive(running, sink))
        served = asyncio.run(served_versions(running))
    assert final["state"] == "finished", final
    return sink, served


async def stop_after_step(running, step: int) -> dict:
    """Start the run, ask it to stop once `step` is recorded; its final status."""
    return await run_until(running, lambda e: e["kind"] == "step" and e["step"] == step, "test")

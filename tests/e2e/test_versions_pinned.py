"""Versions pinned end to end: a rollout replica that restarts between steps comes back serving its
initial weights (version 0). The next Collect names the versions the run expects, the replica
refuses it (FAILED_PRECONDITION), the router has the trainer push the current weights and collects
again: no sample of the old weights is trained, and every step reports staleness_max 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from atgrpo.cli import launcher
from atgrpo.cli.runner import LocalServices
from atgrpo.config import parse_config
from atgrpo.discovery import listed_now
from atgrpo.errors import Unavailable
from atgrpo.rundir import read_metrics
from rollout_svc.client import RolloutClient
from router_svc.loop import RunLoop
from tests.e2e.toy_runs import toy_config

pytestmark = pytest.mark.slow

STEPS = 4
KILL_AFTER = 2


async def serving_version(address: str, timeout_s: float = 120.0) -> int:
    """The model version the replica at `address` serves, once it answers again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with RolloutClient(address) as client:
                return next(p.version for p in await client.policies() if p.adapter == "")
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def run_with_a_restart(cfg, state_dir, address: str) -> int:
    """Steps 1..STEPS as RunLoop.run takes them; after step KILL_AFTER the replica is killed and
    comes back (the launcher restarts it) before the next step starts. Returns what it served
    then."""
    loop = RunLoop(cfg)
    served_after_restart = -1
    try:
        await loop.prepare()
        while loop.ledger.completed < STEPS:
            if (
                await loop._guarded(loop.pipeline.run, loop.ledger.completed + 1)
                and loop.ledger.completed == KILL_AFTER
            ):
                replica = next(s for s in launcher.read_state(state_dir) if s.name == "rollout-a-0")
                os.kill(replica.pid, signal.SIGKILL)
                while (
                    next(s for s in launcher.read_state(state_dir) if s.name == "rollout-a-0").pid
                    == replica.pid
                ):
                    await asyncio.sleep(0.2)
                served_after_restart = await serving_version(address)
    finally:
        await loop.clients.close()
    return served_after_restart


def test_a_restarted_replica_is_resynced_and_no_stale_sample_is_trained(tiny_model, tmp_path):
    cfg = parse_config(toy_config(tmp_path / "run", tiny_model, "L1", steps=STEPS))
    with LocalServices(cfg) as running:
        address = listed_now(running.services.rollout["a"])[0]
        served = asyncio.run(run_with_a_restart(running, tmp_path / "run" / "services", address))
        final_version = asyncio.run(serving_version(address))

    assert served == 0  # the restarted replica came back with its initial weights
    steps = [e for e in read_metrics(tmp_path / "run" / "metrics.jsonl") if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))
    assert [e["pools"]["a"]["staleness_max"] for e in steps] == [0] * STEPS
    assert [e["pools"]["a"]["version"] for e in steps] == list(range(1, STEPS + 1))
    retried = {e["step"]: e["retries"] for e in steps}
    # the refused Collect was recovered from
    assert retried[KILL_AFTER + 1] >= 1 and retried[1] == 0
    # every trained sample came from the weights of the step before
    for step in range(1, STEPS + 1):
        lines = (tmp_path / "run" / "samples" / f"step-{step:06d}.jsonl").read_text().splitlines()
        assert lines and {json.loads(x)["policy"]["version"] for x in lines} == {step - 1}
    assert final_version == STEPS

"""`atgrpo submit` follows the run its Job starts through a real router gRPC server (its run loop
scripted), as `atgrpo train --connect` does, and says what stops it from following."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import pytest

from atgrpo._proto.v1 import router_pb2_grpc
from tests.cluster.conftest import (
    CONFIG,
    config_file,
    submit,
)


class ScriptedLoop:
    """A fake RunLoop (names it as such): three empty steps, then finished. It pins how submit
    follows a run; the loop itself is tested in tests/router."""

    def __init__(self, cfg, emit):
        from atgrpo.rundir import RunDir

        self.cfg, self.emit, self.resumed_from = cfg, emit, 0
        self.ledger = SimpleNamespace(completed=0)
        self.dir = RunDir(cfg.run.run_dir)
        self.stop_requested = asyncio.Event()
        self.clients = SimpleNamespace(close=lambda: asyncio.sleep(0))

    async def prepare(self):
        pass

    async def run(self):
        from router_svc.events import step_event
        from router_svc.steps import StepBatches

        for step in range(1, self.cfg.run.steps + 1):
            await asyncio.sleep(0.2)
            self.ledger.completed = step
            timings = {
                "rollout_seconds": 0.1,
                "train_seconds": 0.1,
                "weight_sync_seconds": 0.0,
                "step_seconds": 0.2,
                "time": time.time(),
                "retries": 0,
                "replicas": {},
                "requeued_tasks": 0,
            }
            self.emit(step_event(step, StepBatches({}, {}, 0), [], {}, timings))
        return "finished"


class Router:
    """A real router gRPC server (ScriptedLoop runs its runs) on its own thread and event loop."""

    def __enter__(self):
        from atgrpo.rpc.server import Binding, create_server
        from router_svc.runs import Runs
        from router_svc.server import RouterServicer

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        servicer = RouterServicer(Runs(ScriptedLoop))
        binding = Binding(
            "atgrpo.v1.RouterService", servicer, router_pb2_grpc.add_RouterServiceServicer_to_server
        )
        self.server = self.call(create_server([binding]))
        self.address = f"127.0.0.1:{self.server.port}"
        return self

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def __exit__(self, *exc):
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_submit_follows_the_run_its_job_starts_to_the_end(cluster, tmp_path, capsys):
    from router_svc.client import RouterClient

    with Router() as router:

        def job_starts_the_run(job):
            """What the Job's container does: `atgrpo train /config/run.yaml --connect`."""
            time.sleep(1.0)  # the init container's wait
            cm = cluster.stored("configmaps")[job["metadata"]["name"]]
            run_yaml = cm["data"]["run.yaml"].replace(
                f"/data/runs/{CONFIG['run']['name']}", str(tmp_path / "router-side")
            )

            stored = cluster.stored("jobs")[job["metadata"]["name"]]
            stored["status"] = {"active": 1}

            async def train_connect():
                async with RouterClient(router.address) as client:
                    status = await client.start_run(run_yaml)
                    async for _ in client.watch_run(status["run_id"]):
                        pass

            router.call(train_connect())
            stored["status"] = {
                "succeeded": 1,
                "conditions": [{"type": "Complete", "status": "True"}],
            }

        cluster.on_create["jobs"] = job_starts_the_run
        mirror = tmp_path / "mirror"
        code = submit(
            cluster, config_file(tmp_path), "--router", router.address, "--run-dir", str(mirror)
        )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "run toy-a finished at step 3" in out
    steps = [
        e["step"]
        for e in map(json.loads, (mirror / "metrics.jsonl").read_text().splitlines())
        if e["kind"] == "step"
    ]
    assert steps == [1, 2, 3]


def test_submit_says_when_the_job_fails_before_its_run_starts(cluster, tmp_path, capsys):
    with Router() as router:

        def job_fails(job):
            stored = cluster.stored("jobs")[job["metadata"]["name"]]
            stored["status"] = {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ]
            }

        cluster.on_create["jobs"] = job_fails
        code = submit(cluster, config_file(tmp_path), "--router", router.address)
    assert code == 1
    err = capsys.readouterr().err
    assert "failed (BackoffLimitExceeded: Job has reached the specified backoff limit)" in err
    assert "kubectl logs -n ml job/rl-atgrpo-run-" in err


def test_an_unreachable_router_says_how_to_reach_it():
    """From a laptop the release's in-cluster router address does not resolve: submit says how
    to port-forward it, once the router has been out of reach for reach_s."""
    from atgrpo.cli.submit import ClusterError, wait_started
    from router_svc.client import RouterClient

    async def go():
        async with RouterClient("127.0.0.1:1", timeout_s=1.0) as client:
            await wait_started(
                client,
                "toy-a",
                lambda: ("pending", ""),
                "-n ml job/j",
                "-n ml svc/rl-atgrpo-router",
                poll_s=0.1,
                reach_s=0.5,
            )

    started = time.monotonic()
    with pytest.raises(
        ClusterError,
        match=r"cannot reach the router at 127\.0\.0\.1:1 .*"
        r"kubectl port-forward -n ml svc/rl-atgrpo-router 50051",
    ):
        asyncio.run(go())
    assert time.monotonic() - started < 30

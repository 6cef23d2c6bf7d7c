"""The five services with real parts, in-process on one background event loop, for fuzzing.

sandbox_svc (bwrap backend), env_svc (built-in environments; code runs in that sandbox over
gRPC), rollout_svc (the tiny model; Collect drives that env_svc over gRPC), trainer_svc (set up
for pool "p" with the tiny model, pushing to that rollout_svc) and router_svc (whose runs point at
those services). Tests call them from their own thread with blocking grpc channels, so a
hypothesis example is a plain function and a server that hangs shows up as a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atgrpo._proto.v1 import (
    common_pb2,
    env_pb2,
    env_pb2_grpc,
    rollout_pb2,
    sandbox_pb2,
    trainer_pb2,
)
from atgrpo.contract import trainer_wire
from atgrpo.rpc.server import RunningServer, create_server

KINDS = ("env", "sandbox", "rollout", "router", "trainer")
FULL_NAMES = {k: f"atgrpo.v1.{k.capitalize()}Service" for k in KINDS}
RUN_ID = "fuzz"


class BackgroundLoop:
    """An asyncio loop in a daemon thread; `run(coro)` blocks the caller until it is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="fuzz-servers", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine, timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Services:
    loop: BackgroundLoop
    running: dict[str, RunningServer]
    model_dir: str
    closers: list = field(default_factory=list)
    channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def address(self, kind: str) -> str:
        return f"127.0.0.1:{self.running[kind].port}"

    def channel(self, kind: str) -> grpc.Channel:
        """A blocking channel without size limits of its own: what the server allows is under
        test."""
        if kind not in self.channels:
            self.channels[kind] = grpc.insecure_channel(
                self.address(kind),
                options=[
                    ("grpc.max_send_message_length", -1),
                    ("grpc.max_receive_message_length", -1),
                ],
            )
        return self.channels[kind]

    def live_episode(self, env: str = "toy") -> str:
        stub = env_pb2_grpc.EnvServiceStub(self.channel("env"))
        return stub.Reset(
            env_pb2.ResetRequest(env=env, task_id="0", seed=1, split="train"), timeout=30
        ).episode_id

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()

        async def stop():
            for running in self.running.values():
                await running.stop(0)
            for close in self.closers:
                result = close()
                if asyncio.iscoroutine(result):
                    await result

        try:
            self.loop.run(stop(), timeout=60)
        finally:
            self.loop.close()


def start_services(model_dir: str) -> Services:
    from atgrpo.sdk.host import EnvHost
    from atgrpo.sdk.servicer import env_bindings
    from atgrpo.sdk.store import EpisodeStore
    from env_svc.server import builtin_registry
    from rollout_svc.client import RolloutClient  # noqa: F401 - imported here, not in the loop
    from rollout_svc.engines.hf import HFEngine
    from rollout_svc.pool import PoolRuntime
    from rollout_svc.replica import Replica
    from rollout_svc.server import bindings as rollout_bindings
    from router_svc.server import bindings as router_bindings
    from sandbox_svc.backends.bwrap import BwrapBackend
    from sandbox_svc.client import SandboxClient
    from sandbox_svc.executor import Executor
    from sandbox_svc.policy import Policy
    from sandbox_svc.server import bindings as sandbox_bindings
    from trainer_svc.client import TrainerClient
    from trainer_svc.server import bindings as trainer_bindings
    from trainer_svc.trainer import Trainer

    loop = BackgroundLoop()
    engine = HFEngine(model_dir, device="cpu", dtype="float32")  # loaded here, not on the loop

    async def start() -> Services:
        running: dict[str, RunningServer] = {}
        executor = Executor(BwrapBackend(Policy()), workers=2, queue=8)
        running["sandbox"] = await create_server(sandbox_bindings(executor))
        sandbox = SandboxClient(f"127.0.0.1:{running['sandbox'].port}")
        # forks of 1024 add up
        host = EnvHost(builtin_registry(), sandbox=sandbox, store=EpisodeStore(200_000, 900))
        running["env"] = await create_server(env_bindings(host))
        from atgrpo.sdk.client import EnvClient

        envs = EnvClient(f"127.0.0.1:{running['env'].port}")
        replica = Replica({"p": PoolRuntime("p", engine)})
        running["rollout"] = await create_server(
            rollout_bindings(replica, envs, engine="hf", device="cpu")
        )
        running["trainer"] = await create_server(trainer_bindings(trainer=Trainer("p")))
        running["router"] = await create_server(router_bindings())
        services = Services(
            loop, running, model_dir, closers=[executor.close, sandbox.close, envs.close]
        )
        async with TrainerClient(f"127.0.0.1:{running['trainer'].port}") as t:
            await t.setup(
                trainer_wire.spec_from_pb(setup_request(model_dir, [services.address("rollout")]))
            )
        return services

    try:
        return loop.run(start())
    except BaseException:
        loop.close()
        raise


def setup_request(model_dir: str, rollout: list[str]) -> trainer_pb2.SetupRequest:
    return trainer_pb2.SetupRequest(
        run_id=RUN_ID,
        pool="p",
        model_path=model_dir,
        agents=["speaker", "listener"],
        seed=0,
        optim=trainer_pb2.OptimParams(lr=1e-4, warmup_steps=0, total_steps=10),
        rollout_addresses=rollout,
    )


def health(services: Services, kind: str) -> str:
    resp = health_pb2_grpc.HealthStub(services.channel(kind)).Check(
        health_pb2.HealthCheckRequest(), timeout=10
    )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def valid_calls(services: Services) -> dict[str, Any]:
    """One real call per service, each of which must succeed."""
    from atgrpo._proto.v1 import (
        rollout_pb2_grpc,
        router_pb2_grpc,
        sandbox_pb2_grpc,
        trainer_pb2_grpc,
    )

    out: dict[str, Any] = {}
    env = env_pb2_grpc.EnvServiceStub(services.channel("env"))
    episode = services.live_episode()
    out["env"] = env.Step(
        env_pb2.StepRequest(episode_id=episode, agent="speaker", action_text="3"), timeout=30
    )
    sandbox = sandbox_pb2_grpc.SandboxServiceStub(services.channel("sandbox"))
    out["sandbox"] = sandbox.Execute(
        sandbox_pb2.ExecuteRequest(code="print(6 * 7)", language="python"), timeout=60
    )
    assert out["sandbox"].stdout == b"42\n", out["sandbox"]
    rollout = rollout_pb2_grpc.RolloutServiceStub(services.channel("rollout"))
    req = rollout_pb2.GenerateRequest(
        pool="p", n=2, sampling=common_pb2.SamplingParams(max_tokens=4)
    )
    req.messages.messages.add(role="user", content="hello")
    out["rollout"] = rollout.Generate(req, timeout=60)
    assert len(out["rollout"].completions) == 2
    trainer = trainer_pb2_grpc.TrainerServiceStub(services.channel("trainer"))
    out["trainer"] = trainer.GetInfo(common_pb2.GetInfoRequest(), timeout=30)
    assert out["trainer"].run_id == RUN_ID and out["trainer"].pool == "p"
    router = router_pb2_grpc.RouterServiceStub(services.channel("router"))
    out["router"] = router.GetInfo(common_pb2.GetInfoRequest(), timeout=30)
    return out

"""rollout_svc with the tiny model over real gRPC: Collect streams each task's groups of K
branches with the real model, refuses plans for versions or adapters it does not serve, and routes
agents of other pools to their replicas (L3 with pools on different replicas)."""

import asyncio
import dataclasses

import grpc
import pytest
from grpc import aio

from atgrpo import errors
from atgrpo.contract import rollout_wire
from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, PolicyRef, Sample, TaskRef
from atgrpo.contract.sampling import Sampling
from atgrpo.rpc.server import create_server
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from rollout_svc.client import RolloutClient
from rollout_svc.engines.hf import HFEngine
from rollout_svc.pool import PoolRuntime
from rollout_svc.replica import Replica
from rollout_svc.server import bindings
from tests.rollout.scripted import PickEnv, pick_plan
from tests.rollout.served import _perturbed, serve


def test_collect_streams_groups_with_the_real_model(tiny_model):
    def plan(**kw):
        return pick_plan(step=3, **kw)

    async def go(c, engine):
        raw = [e async for e in c.stub.Collect(rollout_wire.collect_plan_to_pb(plan()))]
        assert all(
            e.sample.run_id == "r" and e.sample.step == 3
            for e in raw
            if e.WhichOneof("event") == "sample"
        )
        events = [rollout_wire.event_from_pb(e) for e in raw]
        samples = [e for e in events if isinstance(e, Sample)]
        ends = [e for e in events if isinstance(e, EpisodeEnd)]
        assert len(ends) == 2 and all(not e.error for e in ends)
        assert len(samples) == sum(e.turns for e in ends) * 2 * 3
        groups = {}
        for s in samples:
            groups.setdefault((s.task_id, s.agent, s.turn), []).append(s)
        for group in groups.values():
            assert sorted(s.branch for s in group) == [0, 1, 2]
            assert len({tuple(s.prompt_ids) for s in group}) == 1
            assert sum(s.selected for s in group) == 1
            assert all(len(s.logprobs) == len(s.response_ids) for s in group)
            assert all(s.sampling.temperature == 1.0 for s in group)
        stale = rollout_wire.collect_plan_to_pb(plan())
        stale.expected_versions.append(rollout_wire.policy_to_pb(PolicyRef("p", "", 5)))
        with pytest.raises(aio.AioRpcError) as refused:
            [e async for e in c.stub.Collect(stale)]
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "p is at version 0 here, not version 5" in refused.value.details()
        no_adapter = dataclasses.replace(plan(), expected_versions=(PolicyRef("p", "coder", 0),))
        with pytest.raises(errors.FailedPrecondition, match="p/coder has not been loaded here"):
            [e async for e in c.collect(no_adapter)]  # a restarted LoRA replica has no adapters
        with pytest.raises(errors.NotFound):
            [
                e
                async for e in c.collect(
                    plan(agents={"a": AgentPlan("a", "zz"), "b": AgentPlan("b", "p")})
                )
            ]

    serve(tiny_model, go)


def test_collect_routes_other_pools_to_their_replicas(tiny_model):
    """L3 with pools on different replicas: one episode mixes agents of both."""

    async def go():
        registry = Registry(discover=False)
        registry.register(PickEnv)
        envs = LocalEnvs(EnvHost(registry))
        a = Replica({"A": PoolRuntime("A", HFEngine(tiny_model, device="cpu", dtype="float32"))})
        b_engine = HFEngine(tiny_model, device="cpu", dtype="float32")
        b = Replica({"B": PoolRuntime("B", b_engine)})
        server_a = await create_server(bindings(a, envs))
        server_b = await create_server(bindings(b, None))
        try:
            async with (
                RolloutClient(f"127.0.0.1:{server_a.port}") as ca,
                RolloutClient(f"127.0.0.1:{server_b.port}") as cb,
            ):
                await cb.load_weights(_perturbed(b_engine), "B", 1)
                sampling = Sampling(temperature=1.0, max_tokens=3)
                plan = CollectPlan(
                    env="pick",
                    turn_order=("a", "b"),
                    max_turns=1,
                    k=2,
                    tasks=(TaskRef("t", 0, episode=1),),
                    agents={
                        "a": AgentPlan("a", "A", sampling=sampling),
                        "b": AgentPlan("b", "B", sampling=sampling),
                    },
                )
                with pytest.raises(errors.NotFound, match="serves no pool 'B'"):
                    [e async for e in ca.collect(plan)]
                plan = dataclasses.replace(plan, pool_addresses={"B": f"127.0.0.1:{server_b.port}"})
                samples = [e async for e in ca.collect(plan) if isinstance(e, Sample)]
                return {(s.agent, s.policy.pool, s.policy.version) for s in samples}
        finally:
            await server_a.stop(0)
            await server_b.stop(0)

    assert asyncio.run(go()) == {("a", "A", 0), ("b", "B", 1)}

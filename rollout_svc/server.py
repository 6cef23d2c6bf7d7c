"""RolloutService servicer: converts and delegates to the Replica and the tree driver."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from atgrpo._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from atgrpo.contract import rollout_wire
from atgrpo.contract.rollout import EpisodeEnd, PolicyRef, RolloutInfo, WeightsLoaded
from atgrpo.errors import InvalidArgument
from atgrpo.rpc.server import Binding, service_info
from rollout_svc.replica import Replica
from rollout_svc.tree import Envs, collect
from rollout_svc.weights import read_chunk, receive


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(
        self,
        replica: Replica,
        envs: Envs | None,
        *,
        engine: str = "hf",
        device: str = "cpu",
        http_port: int | None = None,
    ):
        self.replica, self.envs = replica, envs
        # The OpenAI-compatible HTTP API beside the gRPC port (atgrpo.rpc.server.SidePort): the
        # same replica, so the same engines and queues. Imported only when asked for: aiohttp.
        self.side_ports = []
        if http_port is not None:
            from rollout_svc.openai_http import OpenAIHttp

            self.side_ports.append(OpenAIHttp(replica, http_port))
        self._service = service_info(
            "rollout", {"engine": engine, "pools": ",".join(sorted(replica.pools))}
        )
        self._engine, self._device = engine, device

    async def GetInfo(
        self, request: common_pb2.GetInfoRequest, context: aio.ServicerContext
    ) -> rollout_pb2.RolloutInfo:
        info = RolloutInfo(
            self._engine,
            self._device,
            tuple(self.replica.policies()),
            weight_dtypes=self.replica.weight_dtypes(),
        )
        return rollout_wire.info_to_pb(info, self._service)

    async def Generate(
        self, request: rollout_pb2.GenerateRequest, context: aio.ServicerContext
    ) -> rollout_pb2.GenerateResponse:
        sampling = rollout_wire.sampling_from_pb(request.sampling)
        which = request.WhichOneof("prompt")
        if which is None:
            raise InvalidArgument("no prompt: set messages or prompt_token_ids")
        self.replica.pool(request.pool)  # NOT_FOUND for an unknown pool before anything else
        if request.HasField("expected_version"):
            self.replica.check_versions(
                [PolicyRef(request.pool, request.adapter, request.expected_version)]
            )
        # room for max_tokens in the context
        budget = self.replica.prompt_budget(request.pool, sampling)
        if which == "messages":
            if not request.messages.messages:
                raise InvalidArgument(
                    "messages is empty; send at least one chat message (or prompt_token_ids)"
                )
            messages = [{"role": m.role, "content": m.content} for m in request.messages.messages]
            ids, truncated = await self.replica.render(request.pool, messages, budget)
        else:
            ids = list(request.prompt_token_ids.ids)
            truncated = len(ids) > budget
            ids = ids[-budget:]
        gen = await self.replica.generate_prompt(
            request.pool, request.adapter, ids, sampling, request.n or 1, truncated
        )
        return rollout_wire.generation_to_pb(gen)

    async def Collect(
        self, request: rollout_pb2.CollectRequest, context: aio.ServicerContext
    ) -> AsyncIterator[rollout_pb2.CollectEvent]:
        if self.envs is None:
            raise InvalidArgument(
                "this replica has no environment service; start it with --env HOST:PORT"
            )
        plan = rollout_wire.collect_plan_from_pb(request)
        if not plan.tasks or not plan.turn_order or plan.max_turns < 1:
            raise InvalidArgument("Collect needs tasks, a turn_order and max_turns >= 1")
        runs = [(t.task_id, t.episode) for t in plan.tasks]
        if min(e for _, e in runs) < 1 or len(set(runs)) != len(runs):
            raise InvalidArgument(
                "number the tasks of a Collect from 1 (TaskRef.episode), each (task_id, episode) "
                "once: the samples carry it back, and it names the tree they are grouped in"
            )
        if not 1 <= plan.k <= 1024:
            raise InvalidArgument(
                f"k={plan.k} must be between 1 and 1024 (branches per agent turn; 0 = 1)"
            )
        missing = [a for a in plan.turn_order if a not in plan.agents]
        if missing:
            raise InvalidArgument(f"agents {missing} are in turn_order but have no AgentRollout")
        for agent in plan.agents.values():
            if agent.pool not in plan.pool_addresses:
                self.replica.pool(agent.pool)
        # Remote pools are checked by their replicas, on each Generate the routed generator sends.
        self.replica.check_versions(
            [p for p in plan.expected_versions if p.pool in self.replica.pools]
        )
        generator = self.replica.routed(plan.pool_addresses, plan.expected_versions)
        try:
            async for event in collect(plan, self.envs, generator):
                yield (
                    rollout_wire.end_to_pb(event, plan)
                    if isinstance(event, EpisodeEnd)
                    else rollout_wire.sample_to_pb(event, plan)
                )
        finally:
            await generator.close()

    async def LoadWeights(
        self, request_iterator: AsyncIterator[rollout_pb2.WeightChunk], context: aio.ServicerContext
    ) -> rollout_pb2.LoadWeightsResponse:
        push = await receive(request_iterator, self.replica.sink)
        start = time.perf_counter()
        await self.replica.load(push)
        return rollout_wire.loaded_to_pb(
            WeightsLoaded(
                PolicyRef(push.pool, push.adapter, push.version),
                push.nbytes,
                int((time.perf_counter() - start) * 1000),
            )
        )


SERVICE = "atgrpo.v1.RolloutService"


class _Registered:
    """Stands in for the server while the generated adder registers its handlers, to keep them."""

    def __init__(self) -> None:
        self.handlers: dict = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.handlers = dict(handlers)


def add_to_server(servicer: RolloutServicer, server: aio.Server) -> None:
    """The generated registration, except that LoadWeights reads a data message as a view of the
    received bytes (`read_chunk`) instead of parsing it into a message: two copies fewer a push."""
    seen = _Registered()
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, seen)
    load = seen.handlers["LoadWeights"]
    seen.handlers["LoadWeights"] = grpc.stream_unary_rpc_method_handler(
        servicer.LoadWeights,
        request_deserializer=read_chunk,
        response_serializer=load.response_serializer,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, seen.handlers),))
    server.add_registered_method_handlers(SERVICE, seen.handlers)


def bindings(replica: Replica, envs: Envs | None, **info) -> list[Binding]:
    return [Binding(SERVICE, RolloutServicer(replica, envs, **info), add_to_server)]

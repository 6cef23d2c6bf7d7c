"""EnvService servicer: thin, over EnvHost; shared by env_svc and `atgrpo env serve`."""

from __future__ import annotations

from grpc import aio

from atgrpo._proto.v1 import common_pb2, env_pb2, env_pb2_grpc
from atgrpo.contract import env_wire as convert
from atgrpo.errors import InvalidArgument
from atgrpo.rpc.server import Binding, service_info
from atgrpo.sdk.host import EnvHost


def _required(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(f"{field} is empty; set it")
    return value


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    def __init__(self, host: EnvHost, details: dict[str, str] | None = None) -> None:
        self.host = host
        self._info = service_info(
            "env", {"envs": ",".join(host.registry.names()), **(details or {})}
        )

    async def GetInfo(
        self, request: common_pb2.GetInfoRequest, context: aio.ServicerContext
    ) -> common_pb2.ServiceInfo:
        return self._info

    async def ListEnvs(
        self, request: env_pb2.ListEnvsRequest, context: aio.ServicerContext
    ) -> env_pb2.ListEnvsResponse:
        return env_pb2.ListEnvsResponse(envs=[convert.spec_to_pb(s) for s in self.host.list_envs()])

    async def Describe(
        self, request: env_pb2.DescribeRequest, context: aio.ServicerContext
    ) -> env_pb2.EnvSpec:
        return convert.spec_to_pb(
            self.host.describe(_required(request.env, "env"), convert.dict_from(request.options))
        )

    async def ListTasks(
        self, request: env_pb2.ListTasksRequest, context: aio.ServicerContext
    ) -> env_pb2.ListTasksResponse:
        ids, total = self.host.list_tasks(
            _required(request.env, "env"),
            request.split or "train",
            request.offset,
            request.limit,
            convert.dict_from(request.options),
        )
        return env_pb2.ListTasksResponse(task_ids=ids, total=total)

    async def Reset(
        self, request: env_pb2.ResetRequest, context: aio.ServicerContext
    ) -> env_pb2.ResetResponse:
        episode_id, spec = await self.host.reset(
            _required(request.env, "env"),
            request.task_id,
            request.seed,
            request.split or "train",
            convert.dict_from(request.options),
        )
        return env_pb2.ResetResponse(episode_id=episode_id, spec=convert.spec_to_pb(spec))

    async def Observe(
        self, request: env_pb2.ObserveRequest, context: aio.ServicerContext
    ) -> env_pb2.ObserveResponse:
        messages, turn = await self.host.observe(
            _required(request.episode_id, "episode_id"), _required(request.agent, "agent")
        )
        return env_pb2.ObserveResponse(messages=convert.messages_to_pb(messages), turn=turn)

    async def Step(
        self, request: env_pb2.StepRequest, context: aio.ServicerContext
    ) -> env_pb2.StepResponse:
        result = await self.host.step(
            _required(request.episode_id, "episode_id"),
            _required(request.agent, "agent"),
            request.action_text,
        )
        return env_pb2.StepResponse(result=convert.step_to_pb(result))

    async def StepMany(
        self, request: env_pb2.StepManyRequest, context: aio.ServicerContext
    ) -> env_pb2.StepManyResponse:
        results = await self.host.step_many(
            [
                (_required(s.episode_id, "episode_id"), _required(s.agent, "agent"), s.action_text)
                for s in request.steps
            ]
        )
        return env_pb2.StepManyResponse(results=[convert.step_to_pb(r) for r in results])

    async def Fork(
        self, request: env_pb2.ForkRequest, context: aio.ServicerContext
    ) -> env_pb2.ForkResponse:
        ids = await self.host.fork(_required(request.episode_id, "episode_id"), request.n)
        return env_pb2.ForkResponse(episode_ids=ids)

    async def Close(
        self, request: env_pb2.CloseRequest, context: aio.ServicerContext
    ) -> env_pb2.CloseResponse:
        return env_pb2.CloseResponse(closed=self.host.close(list(request.episode_ids)))


def env_bindings(host: EnvHost, details: dict[str, str] | None = None) -> list[Binding]:
    return [
        Binding(
            "atgrpo.v1.EnvService",
            EnvServicer(host, details),
            env_pb2_grpc.add_EnvServiceServicer_to_server,
        )
    ]

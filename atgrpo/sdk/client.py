"""EnvClient: talks to any EnvService (env_svc, or an environment served with
`atgrpo env serve`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atgrpo._proto.v1 import env_pb2, env_pb2_grpc
from atgrpo.contract import env_wire as convert
from atgrpo.contract.env import EnvSpec, Message, StepResult
from atgrpo.rpc.client import ServiceClient


class EnvClient(ServiceClient):
    stub_class = env_pb2_grpc.EnvServiceStub

    async def list_envs(self) -> list[EnvSpec]:
        resp = await self._call(self.stub.ListEnvs, env_pb2.ListEnvsRequest())
        return [convert.spec_from_pb(s) for s in resp.envs]

    async def describe(self, env: str, options: Mapping[str, Any] | None = None) -> EnvSpec:
        return convert.spec_from_pb(
            await self._call(
                self.stub.Describe,
                env_pb2.DescribeRequest(env=env, options=convert.struct_from(options)),
            )
        )

    async def list_tasks(
        self,
        env: str,
        split: str = "train",
        offset: int = 0,
        limit: int = 0,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[list[str], int]:
        resp = await self._call(
            self.stub.ListTasks,
            env_pb2.ListTasksRequest(
                env=env,
                split=split,
                offset=offset,
                limit=limit,
                options=convert.struct_from(options),
            ),
        )
        return list(resp.task_ids), resp.total

    async def reset(
        self,
        env: str,
        task_id: str,
        seed: int,
        split: str = "train",
        options: Mapping[str, Any] | None = None,
    ) -> tuple[str, EnvSpec]:
        resp = await self._call(
            self.stub.Reset,
            env_pb2.ResetRequest(
                env=env,
                task_id=task_id,
                seed=seed,
                split=split,
                options=convert.struct_from(options),
            ),
        )
        return resp.episode_id, convert.spec_from_pb(resp.spec)

    async def observe(self, episode_id: str, agent: str) -> tuple[list[Message], int]:
        resp = await self._call(
            self.stub.Observe, env_pb2.ObserveRequest(episode_id=episode_id, agent=agent)
        )
        return convert.messages_from_pb(resp.messages), resp.turn

    async def step(self, episode_id: str, agent: str, action: str) -> StepResult:
        resp = await self._call(
            self.stub.Step,
            env_pb2.StepRequest(episode_id=episode_id, agent=agent, action_text=action),
        )
        return convert.step_from_pb(resp.result)

    async def step_many(self, steps: list[tuple[str, str, str]]) -> list[StepResult]:
        """(episode_id, agent, action) each, in one RPC: a tree's K branches."""
        resp = await self._call(
            self.stub.StepMany,
            env_pb2.StepManyRequest(
                steps=[
                    env_pb2.StepRequest(episode_id=e, agent=a, action_text=t) for e, a, t in steps
                ]
            ),
        )
        return [convert.step_from_pb(r) for r in resp.results]

    async def fork(self, episode_id: str, n: int) -> list[str]:
        resp = await self._call(self.stub.Fork, env_pb2.ForkRequest(episode_id=episode_id, n=n))
        return list(resp.episode_ids)

    async def close_episodes(self, episode_ids: list[str]) -> int:
        resp = await self._call(self.stub.Close, env_pb2.CloseRequest(episode_ids=episode_ids))
        return resp.closed

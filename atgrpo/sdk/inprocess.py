"""LocalEnvs: EnvClient's interface over an in-process EnvHost.

The rollout driver takes either, so it can run against a remote EnvService or, in tests and
single-process tools, an environment class in the same process; the two behave the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atgrpo.contract.env import EnvSpec, Message, StepResult
from atgrpo.sdk.host import EnvHost


class LocalEnvs:
    def __init__(self, host: EnvHost):
        self.host = host

    async def reset(
        self,
        env: str,
        task_id: str,
        seed: int,
        split: str = "train",
        options: Mapping[str, Any] | None = None,
    ) -> tuple[str, EnvSpec]:
        return await self.host.reset(env, task_id, seed, split, options)

    async def observe(self, episode_id: str, agent: str) -> tuple[list[Message], int]:
        return await self.host.observe(episode_id, agent)

    async def step(self, episode_id: str, agent: str, action: str) -> StepResult:
        return await self.host.step(episode_id, agent, action)

    async def step_many(self, steps: list[tuple[str, str, str]]) -> list[StepResult]:
        return await self.host.step_many(steps)

    async def fork(self, episode_id: str, n: int) -> list[str]:
        return await self.host.fork(episode_id, n)

    async def close_episodes(self, episode_ids: list[str]) -> int:
        return self.host.close(episode_ids)

"""The episode driver: AT-GRPO's tree sampling (training) and flat rollouts (evaluation).

Tree mode, per task (Zhao et al., arXiv 2510.11062; DESIGN.md §1): keep one current state; at
turn t, for each agent in turn order, fork the state K ways, sample K responses to the one shared
prompt (a single n=K generation), step each branch with its response, score each branch with
r = alpha * team + local, emit all K samples (one group: task, agent, turn), then keep the best
branch (ties to the lowest index; selection "first" keeps branch 0) and close the others *before
the next agent generates*, so that agent's prompt shows the selected output. The episode ends at
the first step whose selected branch is done, or after max_turns.

Flat mode: one sample per agent-turn on the single state, no forks.

A task's samples are emitted together when its episode ends, so a task that fails midway (the env
service is gone, say) contributes none: its EpisodeEnd carries the error instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Generation, Sample, TaskRef
from atgrpo.sdk.env import Message, StepResult


class Envs(Protocol):
    """EnvClient (remote) or LocalEnvs (in-process)."""

    async def reset(self, env: str, task_id: str, seed: int, split: str = "train",
                    options: dict[str, Any] | None = None) -> tuple[str, Any]: ...
    async def observe(self, episode_id: str, agent: str) -> tuple[list[Message], int]: ...
    async def step(self, episode_id: str, agent: str, action: str) -> StepResult: ...
    async def step_many(self, steps: list[tuple[str, str, str]]) -> list[StepResult]: ...
    async def fork(self, episode_id: str, n: int) -> list[str]: ...
    async def close_episodes(self, episode_ids: list[str]) -> int: ...


class Generator(Protocol):
    async def generate(self, agent: AgentPlan, messages: list[Message], n: int) -> Generation: ...


def select_branch(rewards: list[float], selection: str) -> int:
    """The branch that goes on: the highest reward, ties to the lowest index; or always 0."""
    if selection == "first":
        return 0
    return max(range(len(rewards)), key=lambda i: (rewards[i], -i))


def _prompt(agent: AgentPlan, messages: list[Message]) -> list[Message]:
    if agent.system_prompt and not (messages and messages[0]["role"] == "system"):
        return [{"role": "system", "content": agent.system_prompt}, *messages]
    return messages


class _Episode:
    def __init__(self, plan: CollectPlan, task: TaskRef, envs: Envs, gen: Generator):
        self.plan, self.task, self.envs, self.gen = plan, task, envs, gen
        self.samples: list[Sample] = []
        self.rewards = {a: 0.0 for a in plan.turn_order}
        self.episode_id = ""

    async def _act(self, agent: AgentPlan, turn: int, messages: list[Message]) -> StepResult:
        """One agent's move: K branches in tree mode, one in flat mode; returns the kept result."""
        plan = self.plan
        k = plan.k if plan.mode == "tree" else 1
        generation = await self.gen.generate(agent, _prompt(agent, messages), k)
        branches = await self.envs.fork(self.episode_id, k) if plan.mode == "tree" else [self.episode_id]
        # One RPC for the K branches' steps (K Step calls were most of a tree's env traffic).
        results = await self.envs.step_many([(b, agent.name, c.text)
                                             for b, c in zip(branches, generation.completions, strict=True)])
        mixed = [plan.alpha * r.team_reward + r.local_reward for r in results]
        best = select_branch(mixed, plan.selection)
        for i, (c, r) in enumerate(zip(generation.completions, results, strict=True)):
            self.samples.append(Sample(
                task_id=self.task.task_id, agent=agent.name, turn=turn, branch=i, policy=generation.policy,
                prompt_ids=generation.prompt_ids, response_ids=c.token_ids, logprobs=c.logprobs,
                team_reward=r.team_reward, local_reward=r.local_reward, done=r.done, success=r.success,
                selected=i == best, sampling=agent.sampling, prompt_truncated=generation.prompt_truncated,
                response_truncated=c.finish_reason == "length", finish_reason=c.finish_reason, info=r.info,
                response_text=c.text))
        if plan.mode == "tree":
            await self.envs.close_episodes([self.episode_id, *(b for i, b in enumerate(branches) if i != best)])
            self.episode_id = branches[best]
        self.rewards[agent.name] += mixed[best]
        return results[best]

    async def run(self) -> EpisodeEnd:
        plan, task = self.plan, self.task
        self.episode_id, _ = await self.envs.reset(plan.env, task.task_id, task.seed, task.split, plan.env_options)
        last: StepResult | None = None
        turns = 0
        try:
            for turn in range(plan.max_turns):
                turns = turn + 1
                # Parallel workflows: every agent's prompt is the turn's starting state. Sequential
                # (default): each agent observes after the previous agent's kept move.
                at_start = {n: (await self.envs.observe(self.episode_id, n))[0]
                            for n in plan.turn_order} if plan.parallel else {}
                for name in plan.turn_order:
                    messages = at_start[name] if plan.parallel else (await self.envs.observe(self.episode_id, name))[0]
                    last = await self._act(plan.agents[name], turn, messages)
                    if last.done:
                        return EpisodeEnd(task.task_id, last.success, turns, self.rewards)
            return EpisodeEnd(task.task_id, bool(last and last.success), turns, self.rewards)
        finally:
            await self.envs.close_episodes([self.episode_id])


async def run_episode(plan: CollectPlan, task: TaskRef, envs: Envs, gen: Generator) -> tuple[list[Sample], EpisodeEnd]:
    """One task's samples and end; on failure no samples and an EpisodeEnd with the error."""
    episode = _Episode(plan, task, envs, gen)
    try:
        end = await episode.run()
    except Exception as err:  # noqa: BLE001 - a failed task is reported, the others go on
        return [], EpisodeEnd(task.task_id, False, 0, {}, error=f"{type(err).__name__}: {err}")
    return episode.samples, end


async def collect(plan: CollectPlan, envs: Envs, gen: Generator) -> AsyncIterator[Sample | EpisodeEnd]:
    """Run every task of `plan`, at most `max_concurrent_tasks` at once (so env and sandbox
    latency overlap generation), yielding each task's samples and then its EpisodeEnd."""
    gate = asyncio.Semaphore(max(1, plan.max_concurrent_tasks))

    async def one(task: TaskRef):
        async with gate:
            return await run_episode(plan, task, envs, gen)

    pending = [asyncio.create_task(one(t)) for t in plan.tasks]
    try:
        for finished in asyncio.as_completed(pending):
            samples, end = await finished
            for s in samples:
                yield s
            yield end
    finally:
        for p in pending:
            p.cancel()

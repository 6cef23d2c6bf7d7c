"""The episode driver: AT-GRPO's tree sampling (training) and flat rollouts (evaluation).

Tree mode, per task (Zhao et al., arXiv 2510.11062; DESIGN.md §1), keeps one current state and
plays up to max_turns turns on it, in one of two ways:

- Sequential turns (the default): for each agent in turn order, fork the state K ways, sample K
  responses to the one shared prompt (a single n=K generation), step each branch with its
  response, score each branch with r = alpha * team + local, emit all K samples (one group: task,
  agent, turn), then keep the best branch (ties to the lowest index; selection "first" keeps
  branch 0) and close the others *before the next agent generates*, so that agent's prompt shows
  the selected output. The episode ends at the first step whose selected branch is done. An
  agent whose observe is empty does not act now (an agent program waits on another role): it is
  skipped this turn, with no generation and no sample; in flat and trajectory mode too.
- Parallel turns (plan.parallel): a turn is K joint actions. Every agent observes the pre-turn
  state and samples K responses from it (one n=K generation per agent, all agents at once); the
  pre-turn state is forked K ways once; branch k applies every agent's k-th response in turn
  order (one StepMany per agent, over the K branches). The turn's outcome on branch k is the
  result of the last step applied there: its team reward, done and success reach every agent's
  sample of branch k, and each sample keeps its own step's local reward and info. A step that
  says done ends the turn on its branch: the agents after it take no step there, and their
  samples carry the turn's outcome with local reward 0 and info {"skipped": ...}. The branch that
  goes on is the best joint branch, the highest sum over agents of alpha * team + local (ties to
  the lowest index; "first" keeps branch 0); every agent's sample of it is `selected`, and the
  other forks are closed. The episode ends when the kept branch is done after a turn.
  With plan.parallel_credit all_pairs the turn scores more joint actions than the K diagonal
  ones (branch k of every agent): for two agents every pair (K x K), for more K balanced
  combinations per answer (rollout_svc.joint.credit_shifts). Each agent's answer k gets the
  mean team and local reward of the joint actions it took part in (its credit: not the luck of
  its same-index partner), with done, success and info of its diagonal one; the best of all
  scored joint actions goes on, each agent's answer in it `selected`.

Groups stay (task, agent, turn) in both: each agent's K samples of a turn share one prompt.
EpisodeEnd.agent_rewards sums each agent's mixed reward on the kept branches.

Flat mode (evaluation): the same turns with K = 1 on the single state, no forks.

Trajectory mode (algorithm.grouping: trajectory, the trajectory-level GRPO baseline the paper
compares AT-GRPO against): after reset the state is forked K ways once and the original closed;
copy j is played as a flat episode (train sampling, n=1 generations, the K copies concurrently so
the pool batches them), and each of its samples has branch = j and selected = True (no copy is
preferred). Every turn's sample gets its episode's return, as a single-agent GRPO trainer does:
agent a's return in copy j is R_aj = alpha * T_j + L_aj, where T_j is the team reward of copy j's
last step (the episode's outcome: team rewards here are state values such as a pass fraction, not
increments, so they are not summed) and L_aj the sum of a's local rewards over its turns in copy j.
Each of a's samples of copy j carries team_reward = T_j and local_reward = L_aj, so the router's
mix alpha * team + local is exactly R_aj; the step's own rewards stay in info (step_team_reward,
step_local_reward); done and success stay the step's own. EpisodeEnd: success and turns of copy 0
(an unbiased draw of the policy), agent_rewards the mean of R_aj over the copies (an agent that
never acted in a copy gets alpha * T_j there). Groups are (task, agent) over the K copies.

A task's samples are emitted together when its episode ends, so a task that fails midway (the env
service is gone, say) contributes none: its EpisodeEnd carries the error instead. In trajectory
mode one failing copy fails the task, once every copy has finished and closed its state.

Where a Collect's time goes (CollectClock) rides on its last EpisodeEnd (EpisodeEnd.timing): the
engine's prefill and decode seconds, tokens and FLOPs summed over its generations (each a share of
the batches that made it, rollout_svc.pool), the wall time env RPCs (the sandbox's runs inside
them) were in flight while no generation was (env_s: the env time that generation did not hide),
and the Collect's wall time; the router calls the rest waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any, Protocol

from atgrpo.contract.env import Message, StepResult
from atgrpo.contract.rollout import AgentPlan, CollectPlan, EpisodeEnd, Generation, Sample, TaskRef
from rollout_svc.joint import credit_shifts, credited, scored, turn_outcomes


class Envs(Protocol):
    """EnvClient (remote) or LocalEnvs (in-process)."""

    async def reset(
        self,
        env: str,
        task_id: str,
        seed: int,
        split: str = "train",
        options: dict[str, Any] | None = None,
    ) -> tuple[str, Any]: ...
    async def observe(self, episode_id: str, agent: str) -> tuple[list[Message], int]: ...
    async def step(self, episode_id: str, agent: str, action: str) -> StepResult: ...
    async def step_many(self, steps: list[tuple[str, str, str]]) -> list[StepResult]: ...
    async def fork(self, episode_id: str, n: int) -> list[str]: ...
    async def close_episodes(self, episode_ids: list[str]) -> int: ...


class Generator(Protocol):
    async def generate(self, agent: AgentPlan, messages: list[Message], n: int) -> Generation: ...


class CollectClock:
    """One Collect's time: its generations' timing summed (Generation.timing), and env_s, the wall
    time during which an env call was in flight and no generation was. Episodes run concurrently,
    so env calls overlap each other and the generations of other episodes; summing their durations
    would count the same second many times over, and the env time generation hides costs nothing."""

    def __init__(self):
        self.start = time.perf_counter()
        self.totals: dict[str, float] = {}
        self.env_s = 0.0
        self._env = self._gen = 0  # env calls / generations in flight
        self._since: float | None = None  # when the current env-only stretch began

    def _change(self, env: int = 0, gen: int = 0) -> None:
        now = time.perf_counter()
        if self._since is not None:
            self.env_s += now - self._since
        self._env += env
        self._gen += gen
        self._since = now if self._env and not self._gen else None

    @contextlib.contextmanager
    def _in_flight(self, env: int = 0, gen: int = 0) -> Iterator[None]:
        self._change(env, gen)
        try:
            yield
        finally:
            self._change(-env, -gen)

    def envs(self, envs: Envs) -> Envs:
        """`envs` with every call timed."""
        return _TimedEnvs(envs, self)

    def generator(self, gen: Generator) -> Generator:
        """`gen` with every generation timed and its timing added up."""
        return _TimedGenerator(gen, self)

    def report(self) -> dict[str, float]:
        self._change()
        return {**self.totals, "env_s": self.env_s, "collect_s": time.perf_counter() - self.start}


class _TimedEnvs:
    def __init__(self, envs: Envs, clock: CollectClock):
        self._envs, self._clock = envs, clock

    def __getattr__(self, name: str):
        attr = getattr(self._envs, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def timed(*args, **kwargs):
            with self._clock._in_flight(env=1):
                return await attr(*args, **kwargs)

        return timed


class _TimedGenerator:
    def __init__(self, gen: Generator, clock: CollectClock):
        self._gen, self._clock = gen, clock

    async def generate(self, agent: AgentPlan, messages: list[Message], n: int) -> Generation:
        with self._clock._in_flight(gen=1):
            generation = await self._gen.generate(agent, messages, n)
        for k, v in getattr(generation, "timing", {}).items():
            self._clock.totals[k] = self._clock.totals.get(k, 0.0) + v
        return generation


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
        self.tree = plan.mode == "tree"
        self.k = plan.k if self.tree else 1

    def _mixed(self, r: StepResult) -> float:
        return self.plan.alpha * r.team_reward + r.local_reward

    def _emit(
        self,
        agent: AgentPlan,
        turn: int,
        generation: Generation,
        results: list[StepResult],
        best: int,
    ) -> None:
        for i, (c, r) in enumerate(zip(generation.completions, results, strict=True)):
            self.samples.append(
                Sample(
                    task_id=self.task.task_id,
                    agent=agent.name,
                    turn=turn,
                    branch=i,
                    policy=generation.policy,
                    prompt_ids=generation.prompt_ids,
                    response_ids=c.token_ids,
                    logprobs=c.logprobs,
                    team_reward=r.team_reward,
                    local_reward=r.local_reward,
                    done=r.done,
                    success=r.success,
                    selected=i == best,
                    sampling=agent.sampling,
                    prompt_truncated=generation.prompt_truncated,
                    response_truncated=c.finish_reason == "length",
                    finish_reason=c.finish_reason,
                    info=r.info,
                    response_text=c.text,
                    episode=self.task.episode,
                    prompt_text=generation.prompt_text,
                )
            )

    async def _keep(self, branches: list[str], best: int) -> None:
        """Tree mode: the kept branch becomes the current state; the old state and other forks
        close."""
        if self.tree:
            await self.envs.close_episodes(
                [self.episode_id, *(b for i, b in enumerate(branches) if i != best)]
            )
            self.episode_id = branches[best]

    async def _fork(self, n: int | None = None) -> list[str]:
        n = self.k if n is None else n
        return await self.envs.fork(self.episode_id, n) if self.tree else [self.episode_id]

    # ---- sequential turns ----------------------------------------------------------------------

    async def _act(self, agent: AgentPlan, turn: int, messages: list[Message]) -> StepResult:
        """One agent's move: K branches in tree mode, one in flat mode; returns the kept result."""
        generation = await self.gen.generate(agent, _prompt(agent, messages), self.k)
        branches = await self._fork()
        # One RPC for the K branches' steps (K Step calls were most of a tree's env traffic).
        results = await self.envs.step_many(
            [(b, agent.name, c.text) for b, c in zip(branches, generation.completions, strict=True)]
        )
        mixed = [self._mixed(r) for r in results]
        best = select_branch(mixed, self.plan.selection)
        self._emit(agent, turn, generation, results, best)
        await self._keep(branches, best)
        self.rewards[agent.name] += mixed[best]
        return results[best]

    async def _sequential_turn(self, turn: int) -> StepResult | None:
        """Each agent observes after the previous agent's kept move; stops at the first done."""
        last = None
        for name in self.plan.turn_order:
            messages, _ = await self.envs.observe(self.episode_id, name)
            if not messages:  # the env says this agent does not act now: no generation, no sample
                continue
            last = await self._act(self.plan.agents[name], turn, messages)
            if last.done:
                break
        return last

    # ---- parallel turns (joint actions) --------------------------------------------------------

    async def _generate_all(self, agents: list[AgentPlan]) -> list[Generation]:
        """Every agent's K responses to its own prompt on the pre-turn state, all agents at once."""
        observed = await asyncio.gather(
            *(self.envs.observe(self.episode_id, a.name) for a in agents)
        )
        skipped = [a.name for a, (m, _) in zip(agents, observed, strict=True) if not m]
        if skipped:  # an env host that predates the rule (it refuses these itself)
            raise ValueError(
                f"env {self.plan.env!r} showed {skipped} no messages in a parallel turn: every "
                "agent of a parallel turn acts, so none can be skipped"
            )
        return list(
            await asyncio.gather(
                *(
                    self.gen.generate(a, _prompt(a, m), self.k)
                    for a, (m, _) in zip(agents, observed, strict=True)
                )
            )
        )

    def _joint_actions(self, agents: int, turn: int) -> list[tuple[int, ...]]:
        """The joint actions a parallel turn scores, each a branch index per agent; the first K
        are the diagonal (branch k of every agent), which is all that paired credit scores."""
        diagonal = [(b,) * agents for b in range(self.k)]
        if not self.tree or self.plan.parallel_credit == "paired" or agents < 2:
            return diagonal
        return diagonal + [
            tuple((b + s) % self.k for s in shift)
            for shift in credit_shifts(
                agents, self.k, f"{self.task.task_id}:{self.task.episode}:{turn}"
            )
            for b in range(self.k)
        ]

    async def _apply_joint(
        self,
        branches: list[str],
        agents: list[AgentPlan],
        generations: list[Generation],
        joint: list[tuple[int, ...]],
    ) -> list[list[StepResult | None]]:
        """Branch c applies every agent's answer of joint action c, in turn order; one StepMany per
        agent over the branches still in the turn. steps[agent][c], None where the turn had
        ended."""
        steps: list[list[StepResult | None]] = []
        live = list(range(len(branches)))
        for a, (agent, generation) in enumerate(zip(agents, generations, strict=True)):
            row: list[StepResult | None] = [None] * len(branches)
            answers = [
                (branches[c], agent.name, generation.completions[joint[c][a]].text) for c in live
            ]
            results = await self.envs.step_many(answers) if live else []
            for c, r in zip(live, results, strict=True):
                row[c] = r
            steps.append(row)
            live = [c for c, r in zip(live, results, strict=True) if not r.done]
        return steps

    async def _joint_turn(self, turn: int) -> StepResult:
        """A parallel turn as joint actions; returns the kept joint action's turn outcome."""
        agents = [self.plan.agents[n] for n in self.plan.turn_order]
        generations = await self._generate_all(agents)
        joint = self._joint_actions(len(agents), turn)
        branches = await self._fork(len(joint))
        try:
            steps = await self._apply_joint(branches, agents, generations, joint)
        except BaseException:
            if self.tree:
                await self.envs.close_episodes(branches)
            raise
        outcomes = turn_outcomes(steps)
        results = [
            [scored(own, outcome) for own, outcome in zip(row, outcomes, strict=True)]
            for row in steps
        ]
        best = select_branch(
            [sum(self._mixed(row[c]) for row in results) for c in range(len(branches))],
            self.plan.selection,
        )
        for a, (agent, generation) in enumerate(zip(agents, generations, strict=True)):
            credit = credited(results[a], [j[a] for j in joint], self.k)
            self._emit(agent, turn, generation, credit, joint[best][a])
            self.rewards[agent.name] += self._mixed(results[a][best])
        await self._keep(branches, best)
        return outcomes[best]

    async def run(self) -> EpisodeEnd:
        plan, task = self.plan, self.task
        self.episode_id, _ = await self.envs.reset(
            plan.env, task.task_id, task.seed, task.split, plan.env_options
        )
        return await self.play()

    async def play(self) -> EpisodeEnd:
        """Play the turns from self.episode_id, closing the current state at the end."""
        plan, task = self.plan, self.task
        last: StepResult | None = None
        turns = 0
        try:
            for turn in range(plan.max_turns):
                turns = turn + 1
                last = await (
                    self._joint_turn(turn) if plan.parallel else self._sequential_turn(turn)
                )
                if last is not None and last.done:
                    break
            return EpisodeEnd(task.task_id, bool(last and last.success), turns, self.rewards)
        finally:
            await self.envs.close_episodes([self.episode_id])


def _with_returns(
    copy: int, samples: list[Sample], alpha: float, agents: tuple[str, ...]
) -> tuple[list[Sample], dict[str, float]]:
    """Trajectory mode: copy `copy`'s samples carrying its returns (team = the last step's team
    reward, local = the agent's summed local rewards), and each agent's return R_aj."""
    final = samples[-1].team_reward if samples else 0.0  # every agent skipped every turn
    local = {a: 0.0 for a in agents}
    for s in samples:
        local[s.agent] += s.local_reward
    out = [
        replace(
            s,
            branch=copy,
            team_reward=final,
            local_reward=local[s.agent],
            selected=True,
            info={**s.info, "step_team_reward": s.team_reward, "step_local_reward": s.local_reward},
        )
        for s in samples
    ]
    return out, {a: alpha * final + local[a] for a in agents}


async def _run_copies(
    plan: CollectPlan, task: TaskRef, envs: Envs, gen: Generator
) -> tuple[list[Sample], EpisodeEnd]:
    """Trajectory mode: K independent flat episodes from one reset (see the module docstring)."""
    root, _ = await envs.reset(plan.env, task.task_id, task.seed, task.split, plan.env_options)
    try:
        ids = await envs.fork(root, plan.k)
    finally:
        await envs.close_episodes([root])
    copies = [_Episode(replace(plan, mode="flat", k=1), task, envs, gen) for _ in ids]
    for c, episode_id in zip(copies, ids, strict=True):
        c.episode_id = episode_id
    # Every copy runs to its end (and closes its state) even when one fails, so none is left open.
    ends = await asyncio.gather(*(c.play() for c in copies), return_exceptions=True)
    for e in ends:
        if isinstance(e, BaseException):
            raise e
    samples: list[Sample] = []
    returns = {a: 0.0 for a in plan.turn_order}
    for j, c in enumerate(copies):
        rewritten, r = _with_returns(j, c.samples, plan.alpha, plan.turn_order)
        samples += rewritten
        for a in returns:
            returns[a] += r[a] / len(copies)
    first = ends[0]
    return samples, EpisodeEnd(task.task_id, first.success, first.turns, returns)


async def run_episode(
    plan: CollectPlan, task: TaskRef, envs: Envs, gen: Generator
) -> tuple[list[Sample], EpisodeEnd]:
    """One task's samples and end; on failure no samples and an EpisodeEnd with the error."""
    try:
        if plan.mode == "trajectory":
            return await _run_copies(plan, task, envs, gen)
        episode = _Episode(plan, task, envs, gen)
        end = await episode.run()
    except Exception as err:  # noqa: BLE001 - a failed task is reported, the others go on
        return [], EpisodeEnd(task.task_id, False, 0, {}, error=f"{type(err).__name__}: {err}")
    return episode.samples, end


async def collect(
    plan: CollectPlan, envs: Envs, gen: Generator
) -> AsyncIterator[Sample | EpisodeEnd]:
    """Run every task of `plan`, at most `max_concurrent_tasks` at once (so env and sandbox
    latency overlap generation), yielding each task's samples and then its EpisodeEnd."""
    gate = asyncio.Semaphore(max(1, plan.max_concurrent_tasks))
    clock = CollectClock()
    envs, gen = clock.envs(envs), clock.generator(gen)

    async def one(task: TaskRef):
        async with gate:
            return await run_episode(plan, task, envs, gen)

    pending = [asyncio.create_task(one(t)) for t in plan.tasks]
    try:
        for ended, finished in enumerate(asyncio.as_completed(pending), 1):
            samples, end = await finished
            for s in samples:
                yield s
            if ended == len(pending):  # the last one carries the Collect's time
                end.timing = clock.report()
            yield end
    finally:
        for p in pending:
            p.cancel()

"""Agent programs as environments: `program_env(name, run, ...)`.

An agent program is an ordinary function `run(task, client)` (plain or `async def`) that calls a
model through an `openai` client; the model name of each call is the role (agent) that answers.
As an environment (docs/environments.md, "Agent programs"):

- Each call is an agent turn. observe(role) is the pending call's messages when it is that
  role's, and [] otherwise (the driver skips the role this turn); step(role, text) answers the
  call with `text` and runs the program on, to its next call or its return.
- A step's team reward is 0 until the program returns; the step in which it returns is done,
  with the returned team reward. The acting role's local reward is what `task.reward` gave it.
- The state is the answers given so far. fork() copies them, not the live program: the instance
  holding a paused program resumes it (a fork takes it over from its parent: tree sampling steps
  the forks and closes the parent); any other runs the program again from the start, answering
  its calls from the record up to the branch point (a replay), and refuses a program whose calls
  differ from the record, naming the first one that does.
- Whatever the program returns or raises is checked (program_checks.py): a bad value ends the
  episode as the env's error (EnvCodeError), never a reward.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from atgrpo.errors import EnvCodeError, FailedPrecondition
from atgrpo.sdk import intercept
from atgrpo.sdk.env import Environment, EnvSpec, Message, StepResult, turn_order_option
from atgrpo.sdk.program_checks import Outcome, checked_local, checked_outcome, replay_diff
from atgrpo.sdk.program_run import Call, ProgramError, ProgramRun, Task

__all__ = ["Outcome", "ProgramEnvironment", "Task", "program_env"]


class ProgramEnvironment(Environment):
    """An agent program as an environment; program_env() builds the subclass. Options:
    `max_turns` (at most the class's) and the router's `turn_order`."""

    program: ClassVar[Callable[..., Any]]
    agents: ClassVar[tuple[str, ...]]
    calling_order: ClassVar[tuple[str, ...]]  # the spec's default turn_order
    max_turns: ClassVar[int]
    task_list: ClassVar[Callable[[str], Sequence[Any]] | None] = None
    make_task: ClassVar[Callable[[str, int, str], Any] | None] = None
    success_reward: ClassVar[float] = 1.0
    timeout_s: ClassVar[float] = 60.0  # the program's wall time per step (to its next call)
    settle_s: ClassVar[float] = 0.02  # how long calls issued together may arrive apart
    description: ClassVar[str] = ""
    _task_cache: ClassVar[dict[str, list[Any]]]

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        max_turns = int(self.options.get("max_turns", self.max_turns))
        if not 1 <= max_turns <= self.max_turns:
            raise ValueError(f"{self.name}: max_turns {max_turns} must be in 1..{self.max_turns}")
        self.spec = EnvSpec(
            name=self.name,
            agents=self.agents,
            turn_order=turn_order_option(self.options, self.calling_order, self.name),
            max_turns=max_turns,
            description=self.description,
        )
        self.task: tuple[str, int, str, Any] | None = None
        self.answers: list[str] = []
        self.calls: list[tuple[str, list[Message]]] = []  # the answered calls, in order
        self.unpaid: dict[str, float] = {}  # task.reward given to roles, not yet paid at a step
        self.reached = -1  # rewards given before event `reached` (after that many answers) are in
        self.outcome: tuple[float, dict[str, float], bool] | None = None
        self.error = ""
        self._run: ProgramRun | None = None
        self._call: Call | None = None  # the call the live run is paused at

    # ---- tasks ---------------------------------------------------------------------------------

    def _tasks(self, split: str) -> list[Any]:
        if split not in self._task_cache:
            self._task_cache[split] = list(self.task_list(split))
        return self._task_cache[split]

    def task_ids(self, split: str) -> Sequence[str] | None:
        if self.task_list is None:
            return None
        return [str(i) for i in range(len(self._tasks(split)))]

    def reset(self, task_id: str, seed: int, split: str) -> None:
        if self.task_list is not None:
            tasks = self._tasks(split)
            if not (re.fullmatch(r"\d+", task_id) and int(task_id) < len(tasks)):
                raise ValueError(
                    f"no task {task_id!r} in split {split!r}: ids are 0..{len(tasks) - 1}"
                )
            data = tasks[int(task_id)]
        else:
            data = self.make_task(task_id, seed, split) if self.make_task else None
        self.task = (task_id, seed, split, data)

    # ---- forks and close -----------------------------------------------------------------------

    def fork(self) -> ProgramEnvironment:
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.answers, twin.calls, twin.unpaid = (
            list(self.answers),
            list(self.calls),
            dict(self.unpaid),
        )
        # A live program cannot be copied; it moves to the twin, which resumes it, and this
        # instance replays if it is used again. Tree sampling closes the forked state right after
        # stepping its forks, so one fork of K resumes instead of replaying.
        twin._run, twin._call = self._run, self._call
        self._run = self._call = None
        return twin

    def close(self) -> None:
        if self._run is not None:
            self._run.close()
        self._run = self._call = None

    # ---- the program ---------------------------------------------------------------------------

    def _named(self) -> str:
        program = type(self).program
        return f"env {self.name!r} (program {program.__module__}.{program.__qualname__})"

    def _fail(self, why: str) -> EnvCodeError:
        self.error = f"{self._named()}: {why}"
        self.close()
        return EnvCodeError(self.error)

    async def _next(self, expect: tuple[str, list[Message]] | None = None) -> Call | None:
        """The run's next call, or None when the program ended (self.outcome set, unless a
        replay `expect`ed a call: then the replay says what went wrong)."""
        run = self._run
        try:
            async with asyncio.timeout(self.timeout_s):
                call = await run.next_event(expect)
        except TimeoutError:
            raise self._fail(
                f"the program neither called the model nor returned within {self.timeout_s:g} s "
                f"(after {run.answered} answers); a program must not wait on anything but its "
                "calls, the sandbox and its own work"
            ) from None
        except ProgramError as err:
            raise self._fail(str(err)) from None
        if run.answered > self.reached:  # what task.reward gave since the last event is new
            for role, value in run.drain().items():
                self.unpaid[role] = self.unpaid.get(role, 0.0) + value
            self.reached = run.answered
        if call is None and expect is None:
            value, error = run.finished.result()
            if error is not None:
                raise self._fail(f"the program raised {type(error).__name__}: {error}")
            try:
                self.outcome = checked_outcome(value, self.agents, self.success_reward)
            except ValueError as err:
                raise self._fail(str(err)) from None
        return call

    async def _replay(self) -> None:
        """Run the program from the start, answering its calls from the record."""
        if not intercept.started():  # its first start waits on a thread: not on the loop
            await asyncio.to_thread(intercept.start)
        self._run = ProgramRun(
            type(self).program,
            self.task,
            roles=self.spec.turn_order,
            sandbox=self.sandbox,
            settle_s=self.settle_s,
            ignore_upto=self.reached,
        )
        for i, (answer, recorded) in enumerate(zip(self.answers, self.calls, strict=True)):
            call = await self._next(expect=recorded)
            if call is None or (call.role, call.messages) != recorded:
                now = None if call is None else (call.role, call.messages)
                error = self._run.finished.result()[1] if call is None else None
                raised = f" (it raised {type(error).__name__}: {error})" if error else ""
                raise self._fail(
                    f"the program did not replay: {replay_diff(i, recorded, now)}{raised}. Given "
                    "the same task and answers a program must make the same calls: draw its random "
                    "choices from task.rng or task.seed, not from globals, the clock or state kept "
                    "between runs"
                )
            self._run.answer(call, answer)

    async def _pending(self) -> Call | None:
        """The call the program waits on now (replaying it there first), or None when done."""
        if self.error:
            raise EnvCodeError(self.error)
        if self.task is None:
            raise FailedPrecondition(f"env {self.name!r}: reset the episode first")
        if self.outcome is not None:
            return None
        if self._run is None:
            await self._replay()
        if self._call is None:
            self._call = await self._next()
        return self._call

    async def observe(self, agent: str) -> list[Message]:
        call = await self._pending()
        if call is None or call.role != agent:
            return []  # not this agent's call: it does not act now
        return [dict(m) for m in call.messages]

    async def step(self, agent: str, action: str) -> StepResult:
        call = await self._pending()
        if call is None or call.role != agent:
            waiting = "the program returned" if call is None else f"it waits on {call.role!r}"
            raise FailedPrecondition(
                f"env {self.name!r}: {agent!r} has no pending call ({waiting}); observe "
                f"returns [] for it now, and the driver skips it"
            )
        self.answers.append(action)
        self.calls.append((call.role, call.messages))
        self._call = None
        self._run.answer(call, action)
        following = await self._next()
        self._call = following
        local = self.unpaid.pop(agent, 0.0)
        info: dict[str, Any] = {"call": len(self.answers) - 1}
        if following is not None:
            return StepResult(0.0, self._local(agent, local), info=info)
        team, roles, success = self.outcome
        local += roles.get(agent, 0.0)
        unpaid = {r: v for r, v in {**roles, **self.unpaid}.items() if r != agent}
        if unpaid:  # given to roles that do not step again: said, not silently dropped
            info["unpaid_local_rewards"] = unpaid
        self.close()  # the program is over; forks of this state replay nothing more
        return StepResult(team, self._local(agent, local), done=True, success=success, info=info)

    def _local(self, agent: str, value: float) -> float:
        try:
            return checked_local(value, agent)
        except ValueError as err:
            raise self._fail(str(err)) from None


def program_env(
    name: str,
    run: Callable[..., Any],
    *,
    agents: Sequence[str],
    turn_order: Sequence[str] | None = None,
    max_turns: int,
    tasks: Callable[[str], Sequence[Any]] | None = None,
    make_task: Callable[[str, int, str], Any] | None = None,
    success_reward: float = 1.0,
    timeout_s: float = 60.0,
    settle_s: float = 0.02,
    description: str = "",
) -> type[ProgramEnvironment]:
    """An Environment class that plays `run(task, client)` (docs/environments.md, "Agent
    programs"). `agents`: the roles (the models the program calls); `turn_order`: the roles in
    the order the program usually calls them (default `agents`); `tasks(split)`: the split's task
    data as a list (ids "0".."n-1"), or `make_task(task_id, seed, split)`: one task's data from its
    seed; neither: task.data is None. A returned float is the team reward, with success when it
    reaches `success_reward`; `timeout_s`: the program's wall time per step; `settle_s`: how far
    apart calls issued together (asyncio.gather) may arrive and still be served in turn order."""
    if not callable(run):
        raise TypeError(f"program_env({name!r}): run must be a function run(task, client)")
    if tasks is not None and make_task is not None:
        raise TypeError(f"program_env({name!r}): give tasks or make_task, not both")
    attrs = {
        "name": name,
        "program": staticmethod(run),
        "agents": tuple(agents),
        "calling_order": tuple(turn_order or agents),
        "max_turns": max_turns,
        "task_list": staticmethod(tasks) if tasks else None,
        "make_task": staticmethod(make_task) if make_task else None,
        "success_reward": success_reward,
        "timeout_s": timeout_s,
        "settle_s": settle_s,
        "description": description or (run.__doc__ or "").strip().split("\n")[0],
        "_task_cache": {},
        "__module__": run.__module__,
    }
    EnvSpec(name, attrs["agents"], attrs["calling_order"], max_turns)  # refuse a bad spec now
    return type(f"Program_{name}", (ProgramEnvironment,), attrs)

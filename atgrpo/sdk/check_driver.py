"""The calls atgrpo's driver makes to an environment, as `atgrpo env check` (check.py) makes them.

`_Driver` builds the env, lists its tasks, resets, observes whom the driver observes when,
steps, forks and closes, each through the EnvHost the env service runs, timed; an error the env
raises is a finding under its rule, and each prompt and step result it returns is held to the rules
on single values (a sane prompt, rewards in range, everything surviving the wire). check.py's rules
on episodes are played with these moves, so each reads as the rule it checks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from atgrpo.contract import env_wire
from atgrpo.contract.env import EnvSpec, Message, StepResult, seed_for
from atgrpo.errors import AtgrpoError, EnvCodeError, FailedPrecondition, NotFound
from atgrpo.sdk.check_report import Finding, Report
from atgrpo.sdk.env import REWARD_RANGE
from atgrpo.sdk.host import EnvHost

# Texts a policy finds: the formats envs parse, and what crashes naive parsers: a digit int()
# refuses though str.isdigit() accepts it, more digits than int() converts, JSON nested past the
# recursion limit.
PROBES = (
    "",
    "1",
    "4",
    "up",
    "A",
    "```python\nprint(1)\n```",
    "\\boxed{1}",
    "[[0, 0]]",
    "x" * 2000,
    "\u00b2",
    "9" * 5000,
    "[" * 50_000,
)
ROLES = frozenset({"system", "user", "assistant"})
PROMPT_CHARS_WARN = 100_000  # ~25k tokens: more than most models' context


def _result(r: StepResult) -> tuple:
    return (r.team_reward, r.local_reward, bool(r.done), r.success, r.info)


def _short(value: Any, n: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


class _Driver:
    """One env's check under way: the host it plays through, the report it fills, each call's
    timings."""

    def __init__(self, host: EnvHost, name: str, options: Mapping[str, Any], examples: Sequence):
        self.host, self.name, self.options = host, name, dict(options)
        self.answers = [*examples, *PROBES]
        self.report = Report(name)
        self._ms: dict[str, list[float]] = {}

    def find(self, rule: str, message: str) -> None:
        if not any(f.rule == rule for f in self.report.findings):  # the first case of each rule
            self.report.findings.append(Finding(rule, message))

    async def call(self, what: str, coro, *, strict: bool = True) -> Any:
        """Await a host call, timed; an env bug is a finding (under its rule) and None. Not
        `strict`: a call atgrpo never makes at that point (observe mid-turn) may fail unrecorded."""
        start = time.perf_counter()
        try:
            return await coro
        except AtgrpoError as err:
            if strict:
                self.find(*self._rule_of(err, what))
            return None
        finally:
            self._ms.setdefault(what, []).append((time.perf_counter() - start) * 1000)

    def _rule_of(self, err: AtgrpoError, what: str) -> tuple[str, str]:
        """(rule, message) of an error from the env's host."""
        if isinstance(err, EnvCodeError):
            if "rewards must be finite" in err.message:
                return "rewards-finite", err.message
            if "did not replay" in err.message:
                return "replays", err.message
            return ("observe" if "observe() must return" in err.message else "never-raises"), (
                err.message
            )
        if isinstance(err, FailedPrecondition) and self.host.sandbox is None:
            if "sandbox" in err.message:
                return "sandbox", (
                    f"env {self.name!r} runs code, and no sandbox was given: give --sandbox "
                    "HOST:PORT (`atgrpo up` starts one), or check_env(..., sandbox=...)"
                )
        return "never-raises", f"{what}: {type(err).__name__}: {err.message}"

    async def reset(self, task: tuple[str, int, str]) -> str | None:
        got = await self.call("reset", self.host.reset(self.name, *task, self.options))
        return got[0] if got else None

    def first_seers(self) -> tuple[str, ...]:
        """Who the driver asks to observe at a turn's start: every agent of a parallel turn, the
        first in turn order of a sequential one."""
        return self.spec.turn_order if self.spec.parallel else self.spec.turn_order[:1]

    def next_seers(self, acted: int) -> tuple[str, ...]:
        """Who the driver observes next, after the `acted`-th agent of a turn stepped."""
        order = self.spec.turn_order
        if acted == len(order) - 1:
            return self.first_seers()
        return () if self.spec.parallel else (order[acted + 1],)

    async def seen(
        self, episode: str, agents: tuple[str, ...] | None = None, *, strict: bool = True
    ) -> dict[str, list[Message]] | None:
        """What `agents` (default: those the driver observes at a turn's start) see now."""
        out = {}
        for agent in self.first_seers() if agents is None else agents:
            got = await self.call("observe", self.host.observe(episode, agent), strict=strict)
            if got is None:
                return None
            out[agent] = got[0]
            self.check_messages(agent, got[0])
        return out

    async def step(self, episode: str, agent: str, action: str) -> StepResult | None:
        r = await self.call("step", self.host.step(episode, agent, action))
        if r is not None:
            self.report.steps += 1
            self.check_result(agent, action, r)
        return r

    async def fork(self, episode: str) -> str | None:
        got = await self.call("fork", self.host.fork(episode, 1))
        return got[0] if got else None

    # ---- the rules on single values --------------------------------------------------------

    def check_messages(self, agent: str, messages: list[Message]) -> None:
        roles = {m["role"] for m in messages} - ROLES
        if roles:
            self.find(
                "observe",
                f"observe({agent!r}) uses roles {sorted(roles)}: use system, user and assistant",
            )
        chars = sum(len(m["content"]) for m in messages)
        if chars > PROMPT_CHARS_WARN:
            self.find(
                "observe",
                f"observe({agent!r}) is {chars} characters: more than a model's context holds; "
                "show the agent what this turn needs",
            )
        if env_wire.messages_from_pb(env_wire.messages_to_pb(messages)) != messages:
            self.find("wire", f"observe({agent!r})'s messages change on the wire")

    def check_result(self, agent: str, action: str, r: StepResult) -> None:
        lo, hi = REWARD_RANGE
        for name in ("team_reward", "local_reward"):
            value = getattr(r, name)
            if not lo <= value <= hi:
                self.find(
                    "reward-range",
                    f"step({agent!r}, {_short(action, 40)}) gave {name}={value}, outside "
                    f"{list(REWARD_RANGE)}: alpha * team + local mixes the two, so keep them on "
                    "one scale",
                )
        if not isinstance(r.success, bool):
            self.find(
                "flags",
                f"step({agent!r}, ...) gave success={r.success!r}: return True or False",
            )
        elif r.success and not r.done:
            self.find(
                "flags",
                f"step({agent!r}, {_short(action, 40)}) says success but not done: fine if the "
                "episode goes on after a success on purpose, else say done=True",
            )
        back = env_wire.step_from_pb(env_wire.step_to_pb(r))
        if _result(back) != _result(r):
            self.find("wire", f"step({agent!r}, ...)'s result changes on the wire: {_short(r)}")

    # ---- the env and its tasks -------------------------------------------------------------

    def build(self) -> bool:
        try:
            self.spec: EnvSpec = self.host.describe(self.name, self.options)
        except NotFound:  # no env to check: the caller named the wrong one
            raise
        except AtgrpoError as err:
            self.find("builds", f"{type(err).__name__}: {err.message}")
            return False
        wired = env_wire.dict_from(env_wire.struct_from(self.options))
        if wired != self.options:
            self.find(
                "wire",
                f"the options {_short(self.options)} arrive as {_short(wired)}: use JSON types "
                "(str, number, bool, list, dict with str keys)",
            )
        if env_wire.spec_from_pb(env_wire.spec_to_pb(self.spec)) != self.spec:
            self.find("wire", f"the spec {_short(self.spec)} changes on the wire")
        return True

    def tasks(self, per_split: int) -> dict[str, list[tuple[str, int, str]]]:
        """Each split's first `per_split` tasks as (task_id, seed, split): its listed ids in turn,
        or ids named after their seed where tasks come from seeds."""
        out: dict[str, list[tuple[str, int, str]]] = {}
        for split in self.spec.splits:
            try:
                ids, total = self.host.list_tasks(self.name, split, 0, 0, self.options)
            except AtgrpoError as err:
                self.find("task-ids", f"task_ids({split!r}): {err.message}")
                continue
            if total != -1 and (
                not ids or not all(isinstance(t, str) for t in ids) or len(set(ids)) != len(ids)
            ):
                self.find(
                    "task-ids",
                    f"task_ids({split!r}) gave {_short(ids)}: return None (tasks from seeds) "
                    "or a non-empty list of distinct strings",
                )
                continue
            out[split] = [
                (ids[i % len(ids)] if ids else f"{split}-{i}", seed_for(split, i), split)
                for i in range(per_split)
            ]
        return out

    # ---- what the driver observes ----------------------------------------------------------

    async def first_actor(self, episode: str) -> tuple[str, dict[str, list[Message]]] | None:
        """(the turn's first agent that acts, what the driver observed up to it): a sequential
        turn skips agents shown nothing (an agent program waiting on another role)."""
        if self.spec.parallel:
            seen = await self.seen(episode)
            return None if seen is None else (self.spec.turn_order[0], seen)
        out: dict[str, list[Message]] = {}
        for agent in self.spec.turn_order:
            seen = await self.seen(episode, (agent,))
            if seen is None:
                return None
            out.update(seen)
            if seen[agent]:
                return agent, out
        return None

    async def opening(self, episode: str) -> dict[str, list[Message]] | None:
        """What the driver observes at an episode's start, up to the first agent that acts."""
        acting = await self.first_actor(episode)
        return None if acting is None else acting[1]

    async def host_close(self, *episodes: str) -> None:
        self.host.close(list(episodes))

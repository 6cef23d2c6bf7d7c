"""`atgrpo env check`: does an environment keep the contract atgrpo trains on?

Tree sampling forks a state K ways, steps the forks with different answers and compares their
rewards; a parallel turn applies every agent's answer on one copy; evaluation replays tasks from
their seeds. An environment that breaks one of these rules trains on wrong rewards without any
error, so this suite plays it in process, through the same EnvHost the env service runs, in
seconds, and names each broken rule with its fix. Authors call `check_env(MyEnv)` from a test, or
`atgrpo env check module:Class` from the shell.

The answers it plays are probes (empty text, digits, a word, a code block, a boxed answer, a long
line) plus any the caller gives: most are malformed for a given env, which is the point (malformed
text must score, never raise), and a few example answers reach the env's other paths.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atgrpo.contract import env_wire
from atgrpo.contract.env import EnvSpec, Message, StepResult, seed_for
from atgrpo.errors import AtgrpoError, EnvCodeError, FailedPrecondition, NotFound
from atgrpo.sdk.env import REWARD_RANGE, Environment, Sandbox
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import registry_for

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
STEP_MS_WARN = 1000.0  # tree sampling steps K x agents x turns times per task
SPLIT_PAIRS = 8

# rule -> what it asks; a finding names its rule, so a failure reads with its fix.
RULES: dict[str, str] = {
    "builds": "the class builds from the options and sets self.spec = EnvSpec(...)",
    "sandbox": "an env that runs code is checked with a sandbox",
    "wire": "the options, the spec, the prompts and the step results survive the wire unchanged",
    "config": "the spec agrees with the run config (turn_order, parallel, max_turns)",
    "task-ids": "task_ids(split) is None or a non-empty list of distinct strings",
    "reset-deterministic": "reset(task, seed, split) twice gives the same prompts",
    "splits-differ": "train and eval tasks of the same index differ (warning)",
    "observe": "observe(agent) returns chat messages with known roles, of a sane size",
    "never-raises": "reset, observe, step and fork do not raise, whatever text an agent sends",
    "rewards-finite": "team_reward and local_reward are finite numbers",
    "reward-range": f"rewards stay in {list(REWARD_RANGE)} (warning)",
    "flags": "success is a bool; a success comes with done (warning)",
    "step-deterministic": "the same answers from the same state give the same results and prompts",
    "fork-independent": "stepping a fork changes nothing its parent shows",
    "replays": "a fork shows the agent about to act what its parent shows (an agent program, run "
    "again with the recorded answers, makes the same calls)",
    "parallel-resolves-last": "in a parallel turn, no agent's step changes what the agents see "
    "until the turn's last agent steps",
    "time-per-step": f"step takes under {STEP_MS_WARN:.0f} ms (warning)",
}
WARNINGS = frozenset({"splits-differ", "reward-range", "flags", "time-per-step"})


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str

    @property
    def warning(self) -> bool:
        return self.rule in WARNINGS


@dataclass
class Report:
    env: str
    findings: list[Finding] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)  # mean ms per call
    steps: int = 0

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.warning]

    @property
    def ok(self) -> bool:
        return not self.failures

    def render(self) -> str:
        lines = [
            f"{'warn' if f.warning else 'FAIL'} {f.rule}: {f.message}"
            for f in sorted(self.findings, key=lambda f: f.warning)
        ]
        took = "".join(f", {k} {v:.1f} ms" for k, v in self.timings_ms.items())
        failed = {f.rule for f in self.failures}
        verdict = (
            f"env {self.env!r}: {len(failed)} of {len(RULES)} rules broken"
            if failed
            else f"env {self.env!r}: ok, every rule kept"
        )
        return "\n".join([*lines, f"{verdict} ({self.steps} steps played{took})"])


def _result(r: StepResult) -> tuple:
    return (r.team_reward, r.local_reward, bool(r.done), r.success, r.info)


def _short(value: Any, n: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


class _Checker:
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

    # ---- the rules on episodes -------------------------------------------------------------

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

    async def reset_deterministic(self, task) -> None:
        a, b = await self.reset(task), await self.reset(task)
        if a is None or b is None:
            return
        first, second = await self.opening(a), await self.opening(b)
        await self.host_close(a, b)
        if first is not None and second is not None and first != second:
            agent = next(k for k in {**first, **second} if first.get(k) != second.get(k))
            self.find(
                "reset-deterministic",
                f"reset{task} twice gave {agent!r} different prompts ({_short(first.get(agent))} "
                f"vs {_short(second.get(agent))}): draw everything from atgrpo.sdk.task_rng(split, "
                "seed), not from the global random module, the clock or state kept on the class",
            )

    async def play_twice(self, task, offset: int) -> None:
        """The same answers on two resets of one task, in lockstep: the same results and prompts."""
        a, b = await self.reset(task), await self.reset(task)
        if a is None or b is None:
            return
        try:
            n = 0
            for _turn in range(self.spec.max_turns):
                for i, agent in enumerate(self.spec.turn_order):
                    if not self.spec.parallel:  # as the driver: observe, skip if nothing shown
                        sa, sb = await self.seen(a, (agent,)), await self.seen(b, (agent,))
                        if sa is None or sb is None:
                            return
                        if sa != sb:
                            self.find(
                                "step-deterministic",
                                f"two resets of {task} played with the same answers show "
                                f"{agent!r} {_short(sa[agent])} and {_short(sb[agent])}: a step "
                                "must depend only on the state and the answer",
                            )
                            return
                        if not sa[agent]:
                            continue
                    action = self.answers[(offset + n) % len(self.answers)]
                    n += 1
                    ra, rb = await self.step(a, agent, action), await self.step(b, agent, action)
                    if ra is None or rb is None:
                        return
                    seers = () if ra.done or rb.done else self.next_seers(i)
                    seers = seers if self.spec.parallel else ()  # sequential: seen before a step
                    sa, sb = await self.seen(a, seers), await self.seen(b, seers)
                    if _result(ra) != _result(rb) or sa != sb:
                        self.find(
                            "step-deterministic",
                            f"step({agent!r}, {_short(action, 40)}) from the same state gave "
                            f"{_short(_result(ra))} and {_short(_result(rb))}"
                            + ("" if sa == sb else ", and different prompts after it")
                            + ": a step must depend only on the state and the answer",
                        )
                        return
                    if ra.done:
                        return
        finally:
            await self.host_close(a, b)

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

    async def fork_independent(self, task, offset: int) -> None:
        parent = await self.reset(task)
        if parent is None:
            return
        acting = await self.first_actor(parent)
        child = await self.fork(parent)
        sibling = await self.fork(parent)
        try:
            if acting is None or child is None or sibling is None:
                return
            agent, before = acting
            action = self.answers[offset % len(self.answers)]
            on_child = await self.step(child, agent, action)
            after = await self.seen(parent, tuple(before))
            if before is not None and after is not None and before != after:
                self.find(
                    "fork-independent",
                    f"stepping a fork ({agent!r}, {_short(action, 40)}) changed what its parent "
                    "shows: fork() must copy everything a step changes (keep mutable state on "
                    "the instance, not the class, and out of shared_on_fork)",
                )
                return
            on_sibling = await self.step(sibling, agent, action)
            if on_child is None or on_sibling is None:
                return
            if _result(on_child) != _result(on_sibling):
                self.find(
                    "step-deterministic",
                    f"two forks of one state stepped with ({agent!r}, {_short(action, 40)}) gave "
                    f"{_short(_result(on_child))} and {_short(_result(on_sibling))}: a step must "
                    "depend only on the state and the answer",
                )
        finally:
            await self.host_close(*(e for e in (parent, child, sibling) if e))

    async def fork_replays(self, task, offset: int) -> None:
        """After a step, a fork shows the agent about to act what its parent shows (a sequential
        env; an agent program's fork runs the program again with the recorded answers)."""
        parent, child = await self.reset(task), None
        if parent is None:
            return
        try:
            order, stepped = self.spec.turn_order, 0
            for n in range(2 * len(order)):
                agent = order[n % len(order)]
                shown = await self.seen(parent, (agent,))
                if shown is None:
                    return
                if not shown[agent]:
                    continue  # the driver skips it
                if stepped:
                    break
                r = await self.step(parent, agent, self.answers[offset % len(self.answers)])
                if r is None or r.done:
                    return
                stepped += 1
            else:
                return
            child = await self.fork(parent)
            # Both: an agent program's paused run goes on in one of them, the other replays it.
            for episode, who in ((child, "a fork"), (parent, "the forked state")):
                mine = None if episode is None else await self.seen(episode, (agent,))
                if mine is None:
                    return
                if mine != shown:
                    self.find(
                        "replays",
                        f"after a fork, {who} shows {agent!r} {_short(mine[agent])} where the "
                        f"state showed {_short(shown[agent])}: fork() must copy the whole state",
                    )
                    return
        finally:
            await self.host_close(*(e for e in (parent, child) if e))

    async def parallel_resolves_last(self, task, offset: int) -> None:
        episode = await self.reset(task)
        if episode is None:
            return
        try:
            before = await self.seen(episode, self.spec.turn_order)
            for n, agent in enumerate(self.spec.turn_order[:-1]):
                action = self.answers[(offset + n) % len(self.answers)]
                r = await self.step(episode, agent, action)
                if r is None or r.done:  # ending the turn early is allowed
                    return
                # not what the driver asks mid-turn, so an env may refuse it: then nothing to tell
                now = await self.seen(episode, self.spec.turn_order, strict=False)
                changed = [
                    a for a in self.spec.turn_order if before and now and before[a] != now[a]
                ]
                if changed:
                    self.find(
                        "parallel-resolves-last",
                        f"in a parallel turn, after {agent!r} stepped, {changed[0]!r} sees a "
                        "changed state before the turn's last agent acted: keep each agent's move "
                        "pending and resolve the turn in the last agent's step (docs/"
                        "environments.md, Parallel turns)",
                    )
                    return
        finally:
            await self.host_close(episode)

    async def host_close(self, *episodes: str) -> None:
        self.host.close(list(episodes))

    async def run(
        self, per_split: int, config_problems: Callable[[EnvSpec], Sequence[str]] | None
    ) -> Report:
        if not self.build():
            return self.report
        for problem in config_problems(self.spec) if config_problems else ():
            self.find("config", problem)
        # 8 tasks a split for splits-differ (a warning only: an env of few tasks may draw the same
        # one for both splits by chance; 8 pairs of a 4-task env: 1 in 65,536); the others play
        # the first `per_split`.
        by_split = self.tasks(max(per_split, SPLIT_PAIRS))
        tasks = [t for split in by_split.values() for t in split[:per_split]]
        for i, task in enumerate(tasks):
            await self.reset_deterministic(task)
            await self.play_twice(task, offset=i)
            await self.fork_independent(task, offset=i)
            if not self.spec.parallel:
                await self.fork_replays(task, offset=i)
            if self.spec.parallel and len(self.spec.turn_order) > 1:
                await self.parallel_resolves_last(task, offset=i)
        await self.splits_differ(by_split)
        self.report.timings_ms = {k: sum(v) / len(v) for k, v in self._ms.items()}
        if self.report.timings_ms.get("step", 0.0) > STEP_MS_WARN:
            self.find(
                "time-per-step",
                f"step takes {self.report.timings_ms['step']:.0f} ms on average: tree sampling "
                "calls it K x agents x turns times per task",
            )
        return self.report

    async def splits_differ(self, by_split: dict[str, list[tuple[str, int, str]]]) -> None:
        pairs = list(zip(by_split.get("train", []), by_split.get("eval", []), strict=False))
        for tasks in pairs:
            shown = []
            for task in tasks:
                episode = await self.reset(task)
                if episode is None:
                    return
                shown.append(await self.opening(episode))
                await self.host_close(episode)
            if shown[0] != shown[1]:
                return
        if pairs:
            self.find(
                "splits-differ",
                f"the first {len(pairs)} train and eval tasks show the same prompts: generate "
                "tasks from task_rng(split, seed), so evaluation measures unseen tasks",
            )


async def check_env_async(
    target: str | type[Environment],
    options: Mapping[str, Any] | None = None,
    *,
    sandbox: Sandbox | None = None,
    tasks: int = 3,
    examples: Sequence[str] = (),
    config_problems: Callable[[EnvSpec], Sequence[str]] | None = None,
) -> Report:
    """Run every rule on `target` (an Environment class, 'module:Class', or a registered name) with
    `options`, over `tasks` tasks of each split. `examples`: answers to play before the probes
    (well-formed ones reach more of the env). `config_problems`: a run config's disagreements with
    the env's spec (atgrpo.env_check.spec_problems), reported under rule "config"."""
    name, registry = registry_for(target)
    host = EnvHost(registry, sandbox=sandbox)
    checker = _Checker(host, name, options or {}, examples)
    # The host logs each env bug's traceback for a service's operator; here the finding says it.
    quiet = logging.getLogger("atgrpo.sdk.host")
    was, quiet.disabled = quiet.disabled, True
    try:
        return await checker.run(max(1, tasks), config_problems)
    finally:
        quiet.disabled = was


def check_env(
    target: str | type[Environment], options: Mapping[str, Any] | None = None, **kw
) -> Report:
    """check_env_async from synchronous code (a test, a script)."""
    return asyncio.run(check_env_async(target, options, **kw))

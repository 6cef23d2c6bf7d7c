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

The rules and the report are in check_report.py; the calls the driver makes, each value they
return checked, in check_driver.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from atgrpo.contract.env import EnvSpec
from atgrpo.sdk.check_driver import _Driver, _result, _short
from atgrpo.sdk.check_report import STEP_MS_WARN, Report
from atgrpo.sdk.env import Environment, Sandbox
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import registry_for

SPLIT_PAIRS = 8


class _Checker(_Driver):
    """The rules on episodes, each played on fresh resets of a task; `run` plays them all."""

    # ---- the rules on episodes -------------------------------------------------------------

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

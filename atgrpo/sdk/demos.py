"""Demonstrations for a warm start: train episodes played with the env's own solver
(Environment.demonstration) or a program the user names, each agent's prompt and answer kept.

A model that never writes an answer its env can judge gets the same reward on every branch, so
GRPO has no advantage to learn from. A few hundred supervised examples of the right format (and
often the right answer) fix that; `atgrpo model teach --demos` trains on what this writes.
Only episodes that end in success are kept: a demonstration that fails teaches the failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atgrpo.contract.env import TURN_ORDER_OPTION, EnvSpec, seed_for
from atgrpo.sdk.host import EnvHost

# (agent, its messages) -> the answer, or None: a solver outside the env (a stronger program)
Solver = Callable[[str, list[dict]], "str | None"]


@dataclass(frozen=True)
class Demo:
    task_id: str
    agent: str
    turn: int
    messages: list[dict]  # the chat the agent saw, as the rollout renders it
    response: str  # the answer it should have written


@dataclass(frozen=True)
class DemoStats:
    episodes: int  # played
    kept: int  # ended in success: their demonstrations are written
    demos: int


class NoDemonstration(ValueError):
    pass


async def play(
    host: EnvHost,
    name: str,
    options: dict[str, Any],
    episodes: int,
    *,
    solver: Solver | None = None,
    split: str = "train",
) -> tuple[list[Demo], DemoStats]:
    """Play `episodes` tasks of `split` (the env's own ids where it lists them, else seeds) with
    demonstrations; the demos of the episodes that succeeded, and what was kept."""
    ids, _ = host.list_tasks(name, split, 0, episodes, options)
    out: list[Demo] = []
    kept = 0
    for i in range(episodes):
        task = ids[i % len(ids)] if ids else f"{split}-{i}"
        episode, spec = await host.reset(name, task, seed_for(split, i), split, options)
        try:
            order = list(options.get(TURN_ORDER_OPTION) or spec.turn_order)
            demos, success = await _episode(host, episode, task, order, spec, solver)
        finally:
            host.close([episode])
        if success:
            kept += 1
            out += demos
    return out, DemoStats(episodes, kept, len(out))


async def _episode(
    host: EnvHost,
    episode: str,
    task: str,
    order: list[str],
    spec: EnvSpec,
    solver: Solver | None,
) -> tuple[list[Demo], bool]:
    demos: list[Demo] = []
    parallel = spec.parallel
    for turn in range(spec.max_turns):  # the host ends the episode there too
        # a parallel turn's agents all answer the turn's first state
        seen = {a: (await host.observe(episode, a))[0] for a in order} if parallel else {}
        for agent in order:
            messages = seen[agent] if parallel else (await host.observe(episode, agent))[0]
            if not messages:  # the agent does not act now: skipped, as the driver does
                continue
            text = await answer(host, episode, agent, messages, solver)
            demos.append(Demo(task, agent, turn, [dict(m) for m in messages], text))
            result = await host.step(episode, agent, text)
            if result.done:
                return demos, result.success
    return demos, False


async def answer(
    host: EnvHost, episode: str, agent: str, messages: list[dict], solver: Solver | None
) -> str:
    text = await host.demonstration(episode, agent)
    if text is None and solver is not None:
        text = solver(agent, messages)
    if text is None:
        raise NoDemonstration(
            f"the env has no demonstration for agent {agent!r}: give a solver "
            "(--solver package.module:function taking the agent and its messages)"
        )
    if not isinstance(text, str):
        raise NoDemonstration(f"the solver answered {type(text).__name__}; return a str")
    return text


def write(demos: Iterable[Demo], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for d in demos:
            f.write(json.dumps(asdict(d)) + "\n")


def read(path: Path) -> list[Demo]:
    """The demos of a JSONL file (one {"agent", "messages", "response", ...} a line); ValueError
    naming the line and the fix."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}:{n}: not JSON ({err})") from None
        ok = (
            isinstance(row, dict)
            and isinstance(row.get("agent"), str)
            and isinstance(row.get("response"), str)
            and isinstance(row.get("messages"), list)
            and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in row["messages"]
            )
            and row["messages"]
        )
        if not ok:
            raise ValueError(
                f"{path}:{n}: write {{'agent': str, 'messages': [{{'role', 'content'}}, ...], "
                "'response': str}"
            )
        out.append(
            Demo(
                str(row.get("task_id", "")),
                row["agent"],
                int(row.get("turn", 0)),
                row["messages"],
                row["response"],
            )
        )
    if not out:
        raise ValueError(f"{path}: no demonstrations in it")
    return out

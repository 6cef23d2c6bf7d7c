"""The Environment base class: what a multi-agent task implements to be trained with atgrpo.

An environment holds one episode's state. atgrpo's tree sampling (DESIGN.md §1) forks it K ways
per agent per turn, so `fork()` must give an independent copy; the default deep-copies.

Methods may be plain or `async def` (an environment that calls the sandbox awaits it); the host
awaits whatever is awaitable.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

# What the env service exchanges with the others lives in the contract; authors import it from here.
from atgrpo.contract.env import (  # noqa: F401 - re-exported
    EVAL_SEED_OFFSET,
    TURN_ORDER_OPTION,
    EnvSpec,
    Message,
    StepResult,
    seed_for,
)


class Sandbox(Protocol):
    """Where environments run model-written code (sandbox_svc.client.SandboxClient fits)."""

    async def execute(self, code: str, *, stdin: bytes = b"", **kwargs: Any) -> Any: ...

    async def run_tests(
        self, code: str, cases: list[tuple[bytes, bytes]], **kwargs: Any
    ) -> Any: ...


# The scale atgrpo's own envs keep their rewards on, so `alpha * team + local` mixes like terms:
# `atgrpo env check` warns outside it, and agent programs (atgrpo.sdk.program) may not leave it.
REWARD_RANGE = (-1.0, 1.0)


def turn_order_option(
    options: Mapping[str, Any], agents: tuple[str, ...], env: str
) -> tuple[str, ...]:
    """The agents that act, in order: options["turn_order"] when given, else all of `agents`.

    The router always sets this option to the run config's env.turn_order, so an environment
    that can run with fewer roles (a single agent at L0) learns which ones act from it."""
    raw = options.get(TURN_ORDER_OPTION)
    if raw is None:
        return agents
    order = tuple(raw) if isinstance(raw, (list, tuple)) else ()
    if not order or len(set(order)) != len(order) or not set(order) <= set(agents):
        raise ValueError(
            f"{env}: turn_order {raw!r} must list some of the agents {list(agents)}, each once"
        )
    return order


def task_rng(split: str, seed: int) -> random.Random:
    """A generator for one task: the same (split, seed) always gives the same task."""
    return random.Random(f"{split}:{seed}")


class Environment:
    """Subclass, set `name`, build `self.spec` in __init__, and implement the four methods.

    The host constructs one instance per episode with the run config's `env.options`, sets
    `self.sandbox` when a sandbox service is configured, then calls reset() once.
    """

    name: ClassVar[str] = ""

    def __init__(self, options: Mapping[str, Any] | None = None):
        self.options = dict(options or {})
        self.sandbox: Sandbox | None = None
        self.spec: EnvSpec

    def reset(self, task_id: str, seed: int, split: str) -> None:
        """Start the episode of one task (the same task_id and seed always give the same task)."""
        raise NotImplementedError

    def observe(self, agent: str) -> list[Message]:
        """The chat messages `agent` sees now (its prompt for this turn). An empty list says that
        `agent` does not act now: in a sequential turn the driver skips it (no generation, no
        sample), and it counts as done for the turn; a parallel turn refuses it."""
        raise NotImplementedError

    def step(self, agent: str, action: str) -> StepResult:
        """Apply `agent`'s action text. Malformed text scores (zero or negative reward, with an
        info entry saying what was wrong); it never raises."""
        raise NotImplementedError

    # Attributes every fork shares instead of copying: handles, and what no step changes (a problem
    # set, the spec). Tree sampling forks K times per agent-turn, so copying those is pure cost.
    shared_on_fork: ClassVar[tuple[str, ...]] = ("sandbox", "spec", "options")

    def fork(self) -> Environment:
        """An independent copy of the current state; the `shared_on_fork` attributes are shared."""
        memo: dict[int, Any] = {}
        for name in self.shared_on_fork:
            if hasattr(self, name):
                value = getattr(self, name)
                memo[id(value)] = value
        return copy.deepcopy(self, memo)

    def close(self) -> None:
        """Release what the episode holds (a running program, a process) when it is closed or
        expires. It must not raise; the default holds nothing."""

    def task_ids(self, split: str) -> Sequence[str] | None:
        """The tasks of a split, or None when tasks are generated from seeds (any id is valid)."""
        return None

    def demonstration(self, agent: str) -> str | None:
        """A right answer for `agent` in the current state, as the model should write it (the
        env's own solver), or None where the env has none. `atgrpo model demos` plays episodes with
        these to build supervised demonstrations for a warm start; it never runs during training."""
        return None

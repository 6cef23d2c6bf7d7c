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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

Message = dict[str, str]          # {"role": "system" | "user" | "assistant", "content": str}

# Tasks generated from seeds: training uses seeds 0, 1, 2, ... and evaluation seeds from this
# offset on, so no evaluation puzzle is generated from a training seed.
EVAL_SEED_OFFSET = 1_000_000_000


@dataclass(frozen=True)
class EnvSpec:
    name: str
    agents: tuple[str, ...]
    turn_order: tuple[str, ...]
    max_turns: int
    parallel: bool = False         # agents of one turn act on the same state
    description: str = ""
    splits: tuple[str, ...] = ("train", "eval")

    def __post_init__(self) -> None:
        if sorted(self.turn_order) != sorted(set(self.turn_order)) or not set(self.turn_order) <= set(self.agents):
            raise ValueError(f"{self.name}: turn_order {self.turn_order} must name each of its agents "
                             f"{self.agents} at most once")
        if self.max_turns < 1:
            raise ValueError(f"{self.name}: max_turns must be >= 1, got {self.max_turns}")


@dataclass
class StepResult:
    team_reward: float              # the task's shared progress/success signal
    local_reward: float = 0.0       # the acting role's own objective
    done: bool = False
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)   # JSON-able; e.g. {"parse_error": "..."}
    turn: int = -1                  # filled in by the host: the turn this step belonged to


class Sandbox(Protocol):
    """Where environments run model-written code (sandbox_svc.client.SandboxClient fits)."""

    async def execute(self, code: str, *, stdin: bytes = b"", **kwargs: Any) -> Any: ...

    async def run_tests(self, code: str, cases: list[tuple[bytes, bytes]], **kwargs: Any) -> Any: ...


TURN_ORDER_OPTION = "turn_order"


def turn_order_option(options: Mapping[str, Any], agents: tuple[str, ...], env: str) -> tuple[str, ...]:
    """The agents that act, in order: options["turn_order"] when given, else all of `agents`.

    The router always sets this option to the run config's env.turn_order, so an environment
    that can run with fewer roles (a single agent at L0) learns which ones act from it."""
    raw = options.get(TURN_ORDER_OPTION)
    if raw is None:
        return agents
    order = tuple(raw) if isinstance(raw, (list, tuple)) else ()
    if not order or len(set(order)) != len(order) or not set(order) <= set(agents):
        raise ValueError(f"{env}: turn_order {raw!r} must list some of the agents {list(agents)}, each once")
    return order


def seed_for(split: str, index: int) -> int:
    """The seed of the `index`-th generated task of `split` (train and eval never share one)."""
    return index + (EVAL_SEED_OFFSET if split == "eval" else 0)


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
        """The chat messages `agent` sees now (its prompt for this turn)."""
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

    def task_ids(self, split: str) -> Sequence[str] | None:
        """The tasks of a split, or None when tasks are generated from seeds (any id is valid)."""
        return None

"""The env service's contract: the types an environment's host exchanges with the rollout and the
router (EnvSpec, StepResult, chat messages) and the seed convention they share. Environment
authors import them from atgrpo.sdk, which re-exports them; the converters are env_wire.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


def content_text(value: Any) -> str | None:
    """An OpenAI-style message content as text: a string, or a list of text parts joined; None
    for anything else (images, tool parts), which the policy cannot read. Shared by the rollout's
    OpenAI port and the program envs' interception server, so both read a message alike."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    return None


# Tasks generated from seeds: training uses seeds 0, 1, 2, ... and evaluation seeds from this
# offset on, so no evaluation puzzle is generated from a training seed.
EVAL_SEED_OFFSET = 1_000_000_000


@dataclass(frozen=True)
class EnvSpec:
    name: str
    agents: tuple[str, ...]
    turn_order: tuple[str, ...]
    max_turns: int
    parallel: bool = False  # agents of one turn act on the same state
    description: str = ""
    splits: tuple[str, ...] = ("train", "eval")

    def __post_init__(self) -> None:
        if sorted(self.turn_order) != sorted(set(self.turn_order)) or not set(
            self.turn_order
        ) <= set(self.agents):
            raise ValueError(
                f"{self.name}: turn_order {self.turn_order} must name each of its agents "
                f"{self.agents} at most once"
            )
        if self.max_turns < 1:
            raise ValueError(f"{self.name}: max_turns must be >= 1, got {self.max_turns}")


@dataclass
class StepResult:
    team_reward: float  # the task's shared progress/success signal
    local_reward: float = 0.0  # the acting role's own objective
    done: bool = False
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # JSON-able; e.g. {"parse_error": "..."}
    turn: int = -1  # filled in by the host: the turn this step belonged to


# The option the router sets to the run config's env.turn_order (atgrpo.sdk.turn_order_option).
TURN_ORDER_OPTION = "turn_order"


def seed_for(split: str, index: int) -> int:
    """The seed of the `index`-th generated task of `split` (train and eval never share one)."""
    return index + (EVAL_SEED_OFFSET if split == "eval" else 0)

"""What an agent program gives back, checked: rewards, its return value, and its replays.

Nothing a program returns is trusted: a reward is a finite number inside the SDK's REWARD_RANGE,
a return value is a number or an Outcome; anything else ends the episode as the env's error with
one of these messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atgrpo.contract.env import Message
from atgrpo.sdk.env import REWARD_RANGE


@dataclass(frozen=True)
class Outcome:
    """What a program may return instead of a float: the team reward, optionally each role's own
    reward at the end (paid to the role of the last step; others are listed in its info as
    unpaid), and success (default: team >= the env's success_reward)."""

    team: float
    roles: Mapping[str, float] = field(default_factory=dict)
    success: bool | None = None


def checked_reward(value: Any, what: str) -> float:
    """`value` as a reward: a finite number (not a bool or a text) inside REWARD_RANGE, or
    ValueError naming `what`."""
    try:  # a numpy or torch scalar is a number too
        number = float(value) if not isinstance(value, (bool, str, bytes)) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    lo, hi = REWARD_RANGE
    if not (math.isfinite(number) and lo <= number <= hi):
        raise ValueError(
            f"{what} is {str(value)[:80]!r}: a reward must be a finite number in [{lo}, {hi}], the "
            "scale atgrpo's environments keep (a NaN or inf would make its group's advantages NaN)"
        )
    return number


def checked_outcome(
    value: Any, agents: tuple[str, ...], success_reward: float
) -> tuple[float, dict[str, float], bool]:
    """(team, roles, success) of what the program returned, or ValueError saying what is wrong."""
    if not isinstance(value, Outcome):
        if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
            raise ValueError(
                f"the program returned {type(value).__name__} {str(value)[:80]!r}: return the "
                "team reward (a float) or atgrpo.sdk.program.Outcome(team=..., roles=..., "
                "success=...)"
            )
        value = Outcome(team=value)
    team = checked_reward(value.team, "the returned team reward")
    roles = {}
    for role, reward in dict(value.roles).items():
        if role not in agents:
            raise ValueError(f"the returned Outcome rewards {role!r}, not one of {list(agents)}")
        roles[role] = checked_reward(reward, f"the returned reward of {role!r}")
    if value.success is not None and not isinstance(value.success, bool):
        raise ValueError(f"the returned Outcome has success={value.success!r}: give True or False")
    success = team >= success_reward if value.success is None else value.success
    return team, roles, success


def checked_local(value: float, agent: str) -> float:
    """A step's local reward (every task.reward of the role since its last step, summed)."""
    return checked_reward(
        value, f"{agent!r}'s local reward at this step (its task.reward values summed)"
    )


def _short(text: str, at: int, width: int = 60) -> str:
    """`text` around position `at`."""
    start = max(0, at - width // 2)
    piece = text[start : start + width]
    return ("..." if start else "") + piece + ("..." if start + width < len(text) else "")


def replay_diff(
    index: int, recorded: tuple[str, list[Message]], now: tuple[str, list[Message]] | None
) -> str:
    """Where a replayed call first differs from the recorded one, in a line."""
    role, messages = recorded
    if now is None:
        return f"it ended before call {index} ({role!r}), which the first run made"
    if now[0] != role:
        return f"call {index} was to {role!r} when recorded and is to {now[0]!r} in the replay"
    again = now[1]
    for j, (a, b) in enumerate(zip(messages, again, strict=False)):
        if a != b:
            if a["role"] != b["role"]:
                return f"call {index} ({role!r}): message {j} was {a['role']!r}, is {b['role']!r}"
            at = next(
                (
                    p
                    for p, (x, y) in enumerate(zip(a["content"], b["content"], strict=False))
                    if x != y
                ),
                min(len(a["content"]), len(b["content"])),
            )
            return (
                f"call {index} ({role!r}): message {j} ({a['role']}) differs at character {at}: "
                f"recorded {_short(a['content'], at)!r}, replayed {_short(b['content'], at)!r}"
            )
    return (
        f"call {index} ({role!r}) had {len(messages)} messages when recorded and has "
        f"{len(again)} in the replay"
    )

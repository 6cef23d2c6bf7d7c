"""Reading the planning agents' answers (planning.py): the tool agent's ```python block, the
bounded list literal after a marker (`#### ` for the plan agent, `**Actions List**:` in the tool
program's stdout), the moves as text for prompts, and the U/D/L/R moves Plan-Path and Sokoban play.

Every parse of model text or program output goes through atgrpo.sdk.judge's bounded parsers, so
nothing an agent writes can raise out of a step; kept apart from the workflow so that the
planning env reads as its turns and rewards.
"""

from __future__ import annotations

import json
import re
from typing import Any

from atgrpo.sdk.judge import MAX_DEPTH, MAX_LITERAL_CHARS, JudgeError, brackets, literal
from env_svc.envs._text import clip as _clip

MAX_MOVES_PER_ACTION = 400

_CODE_RE = re.compile(r"```(?:python|py|python3)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The last ```python block of `text` (an unterminated last block counts), or None."""
    blocks = [b for b in _CODE_RE.findall(text) if b.strip()]
    return blocks[-1] if blocks else None


def _balanced(text: str, start: int, what: str) -> str:
    """The bracketed literal starting at text[start] == '[' up to its matching ']'. JudgeError when
    it is not closed, or nests or runs past what judge.literal would take anyway: the scan stops
    there, so a 10,000-deep `[[[...` costs 33 characters, not a recursion."""
    depth, end = 0, min(len(text), start + MAX_LITERAL_CHARS)
    for i, ch in brackets(text, start, end):
        if ch == "[":
            depth += 1
            if depth > MAX_DEPTH:
                raise JudgeError(
                    "too_deep",
                    f"{what} nests brackets more than {MAX_DEPTH} deep; answer with plain data",
                )
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    if end < len(text):
        raise JudgeError(
            "too_large", f"{what} runs past {MAX_LITERAL_CHARS} characters; answer with less"
        )
    raise JudgeError("not_closed", f"{what} is not closed with ']'")


def parse_list_after(text: str, marker: str) -> tuple[Any, JudgeError | None]:
    """The list literal right after the last `marker` that is followed by one: (value, None), or
    (None, a JudgeError saying what was wrong). JSON first; a Python literal (single quotes) is
    accepted too; both through judge.literal (bounded in size, nesting and elements)."""
    positions = [m.end() for m in re.finditer(re.escape(marker), text)]
    if not positions:
        return None, JudgeError("no_marker", f"no '{marker}' found")
    what = f"the list after '{marker}'"
    for pos in reversed(positions):
        j = pos
        while j < len(text) and text[j] in " \t`":
            j += 1
        if j < len(text) and text[j] == "[":
            found = ""
            try:
                found = _balanced(text, j, what)
                return literal(found, what), None
            except JudgeError as err:
                if err.reason == "not_data":  # show the agent the literal it wrote
                    err = JudgeError("not_data", f"{what} is not valid JSON: {_clip(found, 80)}")
                return None, err
    return None, JudgeError(
        "no_list", f'\'{marker}\' is not followed by a JSON list like ["U", "R"]'
    )


def moves_text(moves: Any) -> str:
    return json.dumps(moves, separators=(",", ":"))


def direction_moves(value: Any, *, limit: int = MAX_MOVES_PER_ACTION) -> list[str]:
    """A checked list of U/D/L/R moves (case-insensitive); ValueError says what is wrong."""
    if not isinstance(value, list):
        raise ValueError(f'expected a list of moves like ["U","R"], got {type(value).__name__}')
    if not value:
        raise ValueError("the list of moves is empty; give at least one move")
    if len(value) > limit:
        raise ValueError(f"{len(value)} moves is over the limit of {limit} per answer")
    moves = []
    for i, m in enumerate(value):
        if not isinstance(m, str) or m.strip().upper() not in DIRECTIONS:
            raise ValueError(
                f'unknown move {_clip(repr(m), 40)} at position {i}; use only "U", "D", "L", "R"'
            )
        moves.append(m.strip().upper())
    return moves


DIRECTIONS: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}

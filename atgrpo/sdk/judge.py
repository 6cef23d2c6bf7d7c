"""Judging hostile text: bounded parsers and the one way a judge reports that it could not judge.

A policy under RL writes whatever its judge pays for, including inputs built to crash it: a
10,000-deep `[[[...]]]` raises RecursionError out of `json.loads`, `9**9**9**9` exhausts memory.
Every parser an environment runs on model text is bounded here (size, nesting, exponent), and a
judge that cannot judge says so with `JudgeError`, which the environment turns into a format failure
(`failure_info`): the step scores, the sample's info says why, and the env host counts it in
`atgrpo_env_judge_errors_total{env,reason}` (DESIGN.md section 4b).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

MAX_LITERAL_CHARS = 1 << 16  # one answer's data literal (a move list, a test's arguments)
MAX_DEPTH = 32  # brackets inside brackets: real answers nest a few levels
MAX_ITEMS = 1 << 14  # elements in all containers of one literal together
MAX_INT_DIGITS = 4300  # CPython's own int<->str limit

_REASON_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class JudgeError(ValueError):
    """A judge could not judge this answer. `reason` is a short label (metric-safe: lower case,
    digits, underscores) such as too_large, too_deep, not_data, scorer_error; str(e) says what was
    wrong in words the agent's next prompt or a person can act on."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason if _REASON_RE.match(reason) else "other"


def failure_info(err: JudgeError, **extra: Any) -> dict[str, Any]:
    """A StepResult info for an answer the judge refused: `judge_error` (the reason, counted by the
    host) and `parse_error` (the message)."""
    return {**extra, "judge_error": err.reason, "parse_error": str(err)}


def brackets(text: str, start: int = 0, end: int | None = None) -> Iterator[tuple[int, str]]:
    """(index, character) of every bracket of text[start:end] outside quoted strings, in order
    (linear, no recursion: safe on any input)."""
    quote, escaped = "", False
    for i in range(start, len(text) if end is None else min(end, len(text))):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[](){}":
            yield i, ch


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """The deepest bracket nesting of `text` outside quoted strings, counting up to limit + 1."""
    depth = deepest = 0
    for _, ch in brackets(text):
        if ch in "[({":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        else:
            depth = max(depth - 1, 0)
    return deepest


def check_bounds(
    text: str, what: str, max_chars: int = MAX_LITERAL_CHARS, max_depth: int = MAX_DEPTH
) -> None:
    """Raise JudgeError when `text` is longer than max_chars or nests deeper than max_depth."""
    if len(text) > max_chars:
        raise JudgeError(
            "too_large", f"{what} is {len(text)} characters, over {max_chars}; answer with less"
        )
    if nesting_depth(text, max_depth) > max_depth:
        raise JudgeError(
            "too_deep", f"{what} nests brackets more than {max_depth} deep; answer with plain data"
        )


def _count_items(value: Any, budget: int) -> int:
    """Elements left of `budget` after walking `value` (iteratively; its depth is already
    bounded)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple, set, frozenset)):
            budget -= len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            budget -= len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif (
            isinstance(v, int)
            and not isinstance(v, bool)
            and v.bit_length() > MAX_INT_DIGITS * 3.33
        ):
            return -1
        if budget < 0:
            return budget
    return budget


def literal(
    text: str,
    what: str = "the answer",
    *,
    max_chars: int = MAX_LITERAL_CHARS,
    max_depth: int = MAX_DEPTH,
    python: bool = True,
) -> Any:
    """One data value from `text`: JSON, or (python=True) a Python literal such as ('a', 1) or
    {1, 2}. Never evaluated code; bounded in size, nesting and element count. JudgeError
    otherwise."""
    text = text.strip()
    check_bounds(text, what, max_chars, max_depth)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        if not python:
            raise JudgeError("not_data", f"{what} is not a JSON value: {_clip(text)}") from None
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise JudgeError(
                "not_data", f"{what} is not a JSON value or Python literal: {_clip(text)}"
            ) from None
    if _count_items(value, MAX_ITEMS) < 0:
        raise JudgeError(
            "too_large", f"{what} holds more than {MAX_ITEMS} elements or too large a number"
        )
    return value


def _clip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")

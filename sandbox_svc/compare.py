"""Output comparison for RunTests: exact, whitespace-normalised, and float-tolerant."""

from __future__ import annotations

import math

from atgrpo.contract.sandbox import Compare


def _tokens(data: bytes) -> list[bytes]:
    return data.split()


def _int(token: bytes) -> int | None:
    try:
        return int(token)
    except ValueError:
        return None


def _float_equal(a: bytes, b: bytes, tol: float) -> bool:
    ints = _int(a), _int(b)
    if None not in ints:  # two integers (a count, an answer mod 1e9+7) are equal or wrong
        return ints[0] == ints[1]
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):  # inf - inf is nan: no tolerance would ever hold
        return x == y
    # Absolute for values near zero, relative for large ones (as judges of numeric output do).
    return abs(x - y) <= tol * max(1.0, abs(y))


def outputs_match(actual: bytes, expected: bytes, mode: Compare, tol: float = 1e-6) -> bool:
    """Whether a program's stdout matches the expected stdout under `mode`.

    EXACT compares bytes; WHITESPACE compares whitespace-separated tokens (so trailing newlines
    and spacing don't matter); FLOAT does the same but numeric tokens may differ by `tol`.
    """
    if mode is Compare.EXACT:
        return actual == expected
    got, want = _tokens(actual), _tokens(expected)
    if len(got) != len(want):
        return False
    if mode is Compare.WHITESPACE:
        return got == want
    return all(_float_equal(g, w, tol) for g, w in zip(got, want, strict=True))

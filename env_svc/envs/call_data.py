"""Values that cross the sandbox's wall as data: a function's arguments going in, its result coming
out, as JSON with tags for what JSON cannot say (tuples, sets, non-string keys, nan).

The judge compares decoded values, fresh objects of exact built-in types made here: whatever the
answer returned (an object whose __eq__ is always true, an int subclass, a generator) either
encodes as plain data inside the sandbox or is refused there. `encode` runs in the sandbox harness
(its source is copied into the program, so it uses nothing outside this function); `decode` runs
in the env service on the program's output, after the bounds check.
"""

from __future__ import annotations

import json
from typing import Any

from atgrpo.sdk.judge import JudgeError, check_bounds

MAX_RESULT_CHARS = 4 * 2**20  # one call's encoded result (the sandbox caps its stdout the same)
MAX_DATA_DEPTH = 100  # containers in containers; tags add a level each
_TAGS = ("$tuple", "$set", "$frozenset", "$dict", "$float", "$bytes", "$complex")


def encode(v: Any, _depth: int = 0) -> Any:
    """A JSON-able form of `v`, which must be plain data of exact built-in types (TypeError
    else)."""
    if _depth > 100:
        raise TypeError("the value nests more than 100 levels deep")
    t = type(v)
    if v is None or t is bool or t is str or t is int:
        return v
    if t is float:
        return v if v - v == 0 else {"$float": repr(v)}  # nan and infinities by name
    if t is list:
        return [encode(x, _depth + 1) for x in v]
    if t is tuple:
        return {"$tuple": [encode(x, _depth + 1) for x in v]}
    if t is set or t is frozenset:
        return {"$" + t.__name__: [encode(x, _depth + 1) for x in v]}
    if t is dict:
        return {"$dict": [[encode(k, _depth + 1), encode(x, _depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"$bytes": v.hex()}
    if t is complex:
        return {"$complex": [encode(v.real), encode(v.imag)]}
    raise TypeError(
        f"a {t.__name__} is not plain data (return None, bool, int, float, str, bytes, "
        "or lists, tuples, sets and dicts of them)"
    )


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v  # None, bool, int, float, str: json made them
    if len(v) != 1 or next(iter(v)) not in _TAGS:
        raise JudgeError("not_data", f"an object with keys {sorted(v)[:4]} is not a tagged value")
    tag, x = next(iter(v.items()))
    if tag == "$float":
        if x not in ("nan", "inf", "-inf"):
            raise JudgeError("not_data", f"{x!r} is not a float's name")
        return float(x)
    if tag == "$bytes":
        return bytes.fromhex(x) if isinstance(x, str) else _bad(tag)
    if not isinstance(x, list):
        _bad(tag)
    items = [_decode(y) for y in x]
    try:
        if tag == "$tuple":
            return tuple(items)
        if tag == "$set":
            return set(items)
        if tag == "$frozenset":
            return frozenset(items)
        if tag == "$complex":
            return complex(*items)
        return dict(items)  # $dict: [key, value] pairs
    except (TypeError, ValueError):  # an unhashable key or member, a bad pair
        _bad(tag)


def _bad(tag: str) -> Any:
    raise JudgeError("not_data", f"a malformed {tag} value")


def decode(text: str, what: str = "the result") -> Any:
    """The value `text` (the output of `encode`, as JSON) stands for; JudgeError when it is too
    large, too deep or not a value `encode` makes."""
    check_bounds(text, what, MAX_RESULT_CHARS, 2 * MAX_DATA_DEPTH + 2)
    try:
        return _decode(json.loads(text))
    except (ValueError, RecursionError) as e:
        if isinstance(e, JudgeError):
            raise
        raise JudgeError("not_data", f"{what} is not JSON data") from None


def dumps(v: Any) -> str:
    """`v` encoded as compact JSON text (TypeError or ValueError when it is not data)."""
    return json.dumps(encode(v), separators=(",", ":"), allow_nan=False)

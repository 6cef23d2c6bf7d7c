"""Values that cross the sandbox's wall as data: a function's arguments going in, its result coming
out, as JSON with tags for what JSON cannot say (tuples, sets, non-string keys, nan).

The judge compares decoded values, fresh objects of exact built-in types made here: whatever the
answer returned (an object whose __eq__ is always true, an int subclass, a generator) either
encodes as plain data inside the sandbox or is refused there. `encode` runs in the sandbox harness
(its source is copied into the program, so it uses nothing outside this function); `decode` runs
in the env service on the program's output, hostile like the answer: within bounds on its size,
nesting, element count and hash collisions, in time linear in its length.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from atgrpo.sdk.judge import JudgeError

MAX_RESULT_CHARS = 4 * 2**20  # one call's encoded result (the sandbox caps its stdout the same)
MAX_DATA_DEPTH = 100  # containers in containers (encode refuses deeper values too)
MAX_DATA_ITEMS = 1 << 16  # elements in all containers of one value together
MAX_SAME_HASH = 16  # members of one set or dict that share a hash (real data: one or two)
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


class _Decoder:
    """Decodes one value within bounds: MAX_DATA_DEPTH levels of containers, MAX_DATA_ITEMS
    elements in all of them together, and at most MAX_SAME_HASH members of one set or dict that
    share a hash.

    The last bound is what keeps building the value linear: ints congruent modulo 2**61 - 1 all
    hash alike, so a set of 40,000 of them (under 1 MiB of JSON) takes CPython tens of seconds to
    build, holding the GIL, and with it every thread of the env service, throughout."""

    def __init__(self) -> None:
        self.items = MAX_DATA_ITEMS

    def value(self, v: Any, depth: int = 0) -> Any:
        if isinstance(v, list):
            return [self.value(x, depth + 1) for x in self._elements(v, depth)]
        if not isinstance(v, dict):
            return v  # None, bool, int, float, str: json made them
        if len(v) != 1 or next(iter(v)) not in _TAGS:
            raise JudgeError(
                "not_data", f"an object with keys {sorted(v)[:4]} is not a tagged value"
            )
        tag, x = next(iter(v.items()))
        if tag == "$float":
            if x not in ("nan", "inf", "-inf"):
                raise JudgeError("not_data", f"{x!r} is not a float's name")
            return float(x)
        if tag == "$bytes":
            return bytes.fromhex(x) if isinstance(x, str) else _bad(tag)
        if not isinstance(x, list):
            _bad(tag)
        if tag == "$dict":
            return self._dict(x, depth)
        items = [self.value(y, depth + 1) for y in self._elements(x, depth)]
        if tag == "$tuple":
            return tuple(items)
        if tag == "$complex":
            # Two floats, as encode writes them (complex() would also parse a string's digits).
            return complex(*items) if [type(i) for i in items] == [float, float] else _bad(tag)
        try:
            _few_collisions(items)
        except TypeError:  # an unhashable member
            _bad(tag)
        return set(items) if tag == "$set" else frozenset(items)

    def _dict(self, pairs: list[Any], depth: int) -> dict[Any, Any]:
        out = []
        for pair in self._elements(pairs, depth):
            if not (isinstance(pair, list) and len(pair) == 2):
                _bad("$dict")
            out.append((self.value(pair[0], depth + 1), self.value(pair[1], depth + 1)))
        try:
            _few_collisions(k for k, _ in out)
        except TypeError:  # an unhashable key
            _bad("$dict")
        return dict(out)

    def _elements(self, v: list[Any], depth: int) -> list[Any]:
        """`v`, the elements of a container at `depth`, once they are counted and within bounds."""
        if v and depth >= MAX_DATA_DEPTH:
            raise JudgeError("too_deep", f"the value nests more than {MAX_DATA_DEPTH} levels deep")
        self.items -= len(v)
        if self.items < 0:
            raise JudgeError(
                "too_large", f"the value holds more than {MAX_DATA_ITEMS} elements; return less"
            )
        return v


def _few_collisions(members: Iterable[Any]) -> None:
    """JudgeError when more than MAX_SAME_HASH of `members` share a hash (TypeError when one is
    unhashable). Linear: the hashes are counted, not inserted into a table beside each other."""
    counts = Counter(hash(m) for m in members)
    if counts and max(counts.values()) > MAX_SAME_HASH:
        raise JudgeError(
            "hash_collisions",
            f"over {MAX_SAME_HASH} members of one set or dict share a hash; return other data",
        )


def _bad(tag: str) -> Any:
    raise JudgeError("not_data", f"a malformed {tag} value")


def decode_json(v: Any) -> Any:
    """The value that `v` (the output of `encode`, parsed as JSON) stands for; JudgeError when it is
    too large, too deep, or not a value `encode` makes."""
    return _Decoder().value(v)


def decode(text: str, what: str = "the result") -> Any:
    """decode_json of the JSON `text`; JudgeError also when the text is over MAX_RESULT_CHARS or
    not JSON."""
    if len(text) > MAX_RESULT_CHARS:
        raise JudgeError(
            "too_large", f"{what} is {len(text)} characters, over {MAX_RESULT_CHARS}; return less"
        )
    try:
        v = json.loads(text)  # C, linear; RecursionError past Python's own depth limit
    except (ValueError, RecursionError):
        raise JudgeError("not_data", f"{what} is not JSON data") from None
    return decode_json(v)


def fresh(v: Any) -> Any:
    """A copy of decoded data whose containers are all new, so a caller may mutate it: linear, as
    the data is bounded (copy.deepcopy would rebuild each set member by member, quadratic when the
    members collide). Hashable parts (tuples of them, frozensets, keys, set members) are immutable
    and shared."""
    t = type(v)
    if t is list:
        return [fresh(x) for x in v]
    if t is tuple:
        return tuple(fresh(x) for x in v)
    if t is dict:
        return {k: fresh(x) for k, x in v.items()}
    if t is set:
        return v.copy()
    return v  # scalars, strings, bytes, frozensets


def dumps(v: Any) -> str:
    """`v` encoded as compact JSON text (TypeError or ValueError when it is not data)."""
    return json.dumps(encode(v), separators=(",", ":"), allow_nan=False)

"""Hypothesis strategies for any protobuf message, built from its descriptor.

Every field gets values of its type with the edges a hostile or buggy caller sends: empty and huge
strings, NUL bytes, negative and extreme integers, NaN and infinities, unknown enum values, any
member (or none) of a oneof, nested messages to a bounded depth. `hints` mixes in values that
mean something to the services (an env name, a live episode id, the served pool), so examples get
past the first check and reach the logic behind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

F = FieldDescriptor

HUGE_TEXT = "\u00e9" * (3 * 2**20)  # 6 MiB of UTF-8: under the 64 MiB cap, over any sane field
HUGE_BYTES = b"\x00" * (3 * 2**20)
HUGE_LIST = 5_000

_INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
_SPECIAL_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    math.nan,
    math.inf,
    -math.inf,
    1e30,
    -1e30,
    1e-30,
]


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted(
        {
            v
            for v in (0, 1, 2, -1, lo, hi, lo + 1, hi - 1, 2**31 - 1, -(2**31), 2**53)
            if lo <= v <= hi
        }
    )
    return st.one_of(
        st.integers(max(lo, 0), min(hi, 4)), st.sampled_from(edges), st.integers(lo, hi)
    )


def floats(width: int) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(_SPECIAL_FLOATS), st.floats(width=width))


def texts(hint: Sequence[str] = ()) -> st.SearchStrategy[str]:
    choices = [
        st.text(max_size=12),
        st.sampled_from(
            ["", " ", "\x00", "../../etc/passwd", "\U0001f600" * 3, "a" * 300, HUGE_TEXT]
        ),
    ]
    if hint:
        choices.insert(0, st.sampled_from(list(hint)))
    return st.one_of(*choices)


def blobs() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=32), st.sampled_from([b"", b"\x00" * 7, HUGE_BYTES]))


# field name -> list of values to mix in, or a strategy replacing the field's
Hints = Mapping[str, Any]


class MessageStrategies:
    """`for_message(descriptor)` -> a strategy of messages of that type."""

    def __init__(
        self,
        message_class: Callable[[Descriptor], type[Message]],
        hints: Hints | None = None,
        max_depth: int = 4,
    ):
        self._class, self.hints, self.max_depth = message_class, dict(hints or {}), max_depth

    def _scalar(self, f: FieldDescriptor) -> st.SearchStrategy:
        hint = self.hints.get(f.name)
        if isinstance(hint, st.SearchStrategy):
            return hint
        if f.type in (F.TYPE_STRING,):
            return texts(hint or ())
        if f.type == F.TYPE_BYTES:
            return blobs()
        if f.type == F.TYPE_BOOL:
            return st.booleans()
        if f.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            base = floats(64 if f.type == F.TYPE_DOUBLE else 32)
            return st.one_of(st.sampled_from(list(hint)), base) if hint else base
        if f.type == F.TYPE_ENUM:
            known = [v.number for v in f.enum_type.values]
            # open enums: unknown values too
            return st.one_of(st.sampled_from(known), integers(-(2**31), 2**31 - 1))
        lo, hi = _INT_RANGES[f.type]
        base = integers(lo, hi)
        return st.one_of(st.sampled_from(list(hint)), base) if hint else base

    def _value(self, f: FieldDescriptor, depth: int) -> st.SearchStrategy:
        if f.type == F.TYPE_MESSAGE:
            return self.for_message(f.message_type, depth + 1)
        return self._scalar(f)

    def field(self, f: FieldDescriptor, depth: int = 0) -> st.SearchStrategy:
        hint = self.hints.get(f.name)
        if isinstance(hint, st.SearchStrategy) and f.type == F.TYPE_MESSAGE:
            return hint
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, val_f = (
                f.message_type.fields_by_name["key"],
                f.message_type.fields_by_name["value"],
            )
            return st.dictionaries(self._scalar(key_f), self._value(val_f, depth), max_size=3)
        if f.is_repeated:
            item = self._value(f, depth)
            lists = [st.lists(item, max_size=3)]
            if f.type not in (F.TYPE_MESSAGE, F.TYPE_STRING, F.TYPE_BYTES):
                lists.append(st.builds(lambda v: [v] * HUGE_LIST, item))  # one long list
            if isinstance(hint, list) and f.type != F.TYPE_MESSAGE:
                lists.insert(0, st.just(list(hint)))
            return st.one_of(*lists)
        return self._value(f, depth)

    def for_message(self, descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
        cls = self._class(descriptor)
        if depth >= self.max_depth:
            return st.just(cls())
        fields = {f.name: self.field(f, depth) for f in descriptor.fields}
        return st.fixed_dictionaries({}, optional=fields).map(lambda values: build(cls, values))


def build(cls: type[Message], values: Mapping[str, Any]) -> Message:
    """A `cls` with `values` set (setting a second member of a oneof clears the first: any wins)."""
    m = cls()
    for name, value in values.items():
        f = cls.DESCRIPTOR.fields_by_name[name]
        target = getattr(m, name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            as_message = f.message_type.fields_by_name["value"].type == F.TYPE_MESSAGE
            for k, v in value.items():
                if as_message:
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif f.is_repeated:
            target.extend(value)
        elif f.type == F.TYPE_MESSAGE:
            target.CopyFrom(value)
        else:
            setattr(m, name, value)
    return m


@st.composite
def mutated(draw, base: Message, gen: MessageStrategies, max_depth: int = 4) -> Message:
    """`base` with one field, somewhere in it, replaced by a random value of its type: a request
    that is valid but for one mistake, which reaches far deeper than a random one."""
    msg = base.__class__()
    msg.CopyFrom(base)
    target = msg
    for depth in range(max_depth):
        f = draw(st.sampled_from(list(target.DESCRIPTOR.fields)))
        is_map = f.message_type is not None and f.message_type.GetOptions().map_entry
        value = getattr(target, f.name)
        if (
            f.type == F.TYPE_MESSAGE
            and not is_map
            and depth + 1 < max_depth
            and draw(st.booleans())
        ):
            if f.is_repeated and len(value):
                target = value[draw(st.integers(0, len(value) - 1))]
                continue
            if not f.is_repeated and target.HasField(f.name):
                target = value
                continue
        new = draw(gen.field(f, depth))
        if is_map or f.is_repeated:
            target.ClearField(f.name)
        if is_map:
            as_message = f.message_type.fields_by_name["value"].type == F.TYPE_MESSAGE
            for k, v in new.items():
                if as_message:
                    getattr(target, f.name)[k].CopyFrom(v)
                else:
                    getattr(target, f.name)[k] = v
        elif f.is_repeated:
            getattr(target, f.name).extend(new)
        elif f.type == F.TYPE_MESSAGE:
            getattr(target, f.name).CopyFrom(new)
        else:
            setattr(target, f.name, new)
        break
    return msg


@st.composite
def mutated_stream(draw, base: list[Message], gen: MessageStrategies) -> list[Message]:
    """A valid stream with one mistake: one message mutated, or one dropped, repeated or moved."""
    msgs = list(base)
    how = draw(st.sampled_from(["field", "field", "drop", "repeat", "move"]))
    i = draw(st.integers(0, len(msgs) - 1))
    if how == "field":
        msgs[i] = draw(mutated(msgs[i], gen))
    elif how == "drop":
        del msgs[i]
    elif how == "repeat":
        msgs.insert(i, msgs[i])
    else:
        msgs.insert(draw(st.integers(0, len(msgs) - 1)), msgs.pop(i))
    return msgs

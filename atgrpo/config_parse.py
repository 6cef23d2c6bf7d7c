"""Build frozen dataclasses from plain dicts (parsed YAML), collecting every error.

The parser never stops at the first problem: each one is appended to a list of
``(dotted.field, message)`` pairs and a stand-in value is used so the rest of the tree can
still be checked. ``atgrpo.config`` turns that list into one ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

Errors = list[tuple[str, str]]

# YAML 1.1 (PyYAML) reads `1e-6` as a *string*; accept such strings for float fields.
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_MISSING = object()


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def show(value: object, limit: int = 60) -> str:
    """A value as the user wrote it in YAML (true, not True)."""
    if value is None or isinstance(value, bool):
        return yaml.safe_dump(value).split("\n")[0]
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' when `word` is close to one of `choices`, else ''."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def choices_text(choices: Iterable[str]) -> str:
    names = sorted(choices)
    return ", ".join(repr(c) for c in names) if names else "(none)"


def _configurable(f: dataclasses.Field) -> bool:
    """Whether a run config sets `f` (a contract type may carry fields only code sets)."""
    return f.init and f.metadata.get("config", True)


def _flat_keys(cls: type, hints: dict[str, Any]) -> dict[str, str]:
    """key -> the FLAT field of `cls` whose dataclass takes it (FLAT fields nest)."""
    return {
        key: f.name
        for f in dataclasses.fields(cls)
        if f.metadata.get("flat")
        for key in section_types(hints[f.name])
    }


def section_types(cls: type) -> dict[str, Any]:
    """The keys a section of dataclass `cls` takes, each with its type (FLAT fields' keys
    included)."""
    hints = get_type_hints(cls)
    out = {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if _configurable(f) and not f.metadata.get("flat")
    }
    for key, owner in _flat_keys(cls, hints).items():
        out[key] = section_types(hints[owner])[key]
    return out


def build(cls: type, data: object, path: str, errs: Errors, base: Any = None) -> Any:
    """Build dataclass `cls` from mapping `data`.

    `base` (an instance of `cls`) supplies the values of keys that `data` leaves out, so a
    partial section overrides only what it names (e.g. eval sampling keeps temperature 0).
    """
    if not isinstance(data, Mapping):
        errs.append(
            (
                path or "<root>",
                f"expected a mapping of keys to values, got {show(data)}. "
                f"Write it as `key: value` lines",
            )
        )
        data, errs = {}, []  # one error for the section, not one per missing field
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if _configurable(f)}
    flat = _flat_keys(cls, hints)
    valid = [k for k, f in fields.items() if not f.metadata.get("flat")] + list(flat)
    for key in data:
        if key not in valid:
            hint = did_you_mean(key, valid) or f" Valid keys: {', '.join(valid)}"
            errs.append((join(path, key), f"unknown key {str(key)!r}.{hint}"))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        sub = join(path, name)
        default = getattr(base, name) if base is not None else _default(f)
        if f.metadata.get("flat"):
            own = {k: v for k, v in data.items() if flat.get(k) == name}
            kwargs[name] = build(hints[name], own, path, errs, default)
        elif name in data:
            kwargs[name] = convert(hints[name], data[name], sub, errs, default)
        elif default is not _MISSING:
            kwargs[name] = default
        else:
            where = f"under `{path}:`" if path else "at the top level"
            errs.append((sub, f"required field is missing. Add `{name}:` {where}"))
            kwargs[name] = placeholder(hints[name])
    return cls(**kwargs)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _MISSING


def placeholder(tp: Any) -> Any:
    """A stand-in of type `tp` used after an error, so checking can go on."""
    origin = get_origin(tp)
    if origin is Literal:
        return get_args(tp)[0]
    if origin in (Union, types.UnionType):
        return None
    if origin is tuple:
        return ()
    if origin is dict or tp is dict:
        return {}
    if dataclasses.is_dataclass(tp):
        return build(tp, {}, "", [])
    return {str: "", int: 0, float: 0.0, bool: False}.get(tp)


def convert(tp: Any, value: object, path: str, errs: Errors, default: Any = _MISSING) -> Any:
    """Check `value` against type `tp`; on error record it and return a stand-in."""
    fallback = placeholder(tp) if default is _MISSING else default
    origin, args = get_origin(tp), get_args(tp)

    def bad(expected: str, fix: str) -> Any:
        errs.append((path, f"expected {expected}, got {show(value)}. {fix}"))
        return fallback

    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return convert(inner, value, path, errs, default)
    if tp is Any:  # free-form (env options): passed through as written
        return value
    if value is None:  # `key:` with nothing after it
        fix = (
            ", or remove the key to use the default"
            if default is not _MISSING
            else " (this field is required)"
        )
        errs.append((path, f"is empty (null). Give a value{fix}"))
        return fallback
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        hint = did_you_mean(value, args) if isinstance(value, str) else ""
        options = ", ".join(map(repr, args))
        errs.append((path, f"must be one of {options}, got {show(value)}." + (hint or " Pick one")))
        return fallback
    if dataclasses.is_dataclass(tp):
        base = default if dataclasses.is_dataclass(default) else None
        return build(tp, value, path, errs, base)
    if tp is bool:
        return value if isinstance(value, bool) else bad("true or false", "Write true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return bad("an integer", "Write a whole number without quotes")
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            value = float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return bad("a number", "Write a finite number such as 0.5 or 1.0e-6")
    if tp is str:
        return value if isinstance(value, str) else bad("a string", "Quote the value")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            return bad("a list", "Write a YAML list such as [a, b]")
        if len(args) == 2 and args[1] is Ellipsis:
            item_types = [args[0]] * len(value)
        elif len(args) != len(value):
            return bad(f"a list of {len(args)} items", f"Give exactly {len(args)} values")
        else:
            item_types = list(args)
        n_err = len(errs)
        items = tuple(
            convert(t, v, f"{path}[{i}]", errs)
            for i, (t, v) in enumerate(zip(item_types, value, strict=True))
        )
        return items if len(errs) == n_err else fallback
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            return bad("a mapping", "Write it as `key: value` lines")
        val_t = args[1] if args else Any
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                errs.append((join(path, k), f"key {show(k)} must be a string. Quote it"))
                continue
            out[k] = convert(val_t, v, join(path, k), errs)
        return out
    raise TypeError(f"config schema uses unsupported type {tp!r} at {path}")  # a schema bug


def to_plain(obj: Any) -> Any:
    """Dataclasses -> dicts and tuples -> lists, dropping None fields (their default)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            if not _configurable(f):
                continue
            value = to_plain(getattr(obj, f.name))
            if f.metadata.get("flat"):
                out.update(value)
            elif value is not None:
                out[f.name] = value
        return out
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    return obj


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])(i?B|i|B)?\s*$", re.IGNORECASE)
_SIZE_POWER = {"K": 1, "M": 2, "G": 3, "T": 4}


def parse_bytes(text: str) -> int | None:
    """'80GiB' / '80Gi' -> 80 * 2**30, '80GB' / '80G' -> 80 * 10**9; None when it is not a size.
    A bare number is refused: '80' could be GB or GiB, 7% apart, which decides whether a run
    fits."""
    m = _SIZE_RE.match(text)
    if not m:
        return None
    number, prefix, suffix = float(m.group(1)), m.group(2).upper(), (m.group(3) or "").lower()
    base = 1024 if suffix.startswith("i") else 1000
    return int(number * base ** _SIZE_POWER[prefix])


Rule = tuple[Callable[[Any], bool], str, str]  # (ok, requirement, fix)
# agent and pool names become metric labels, adapter names and file names
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
AT_LEAST_1: Rule = (lambda v: v >= 1, "at least 1", "Set it to 1 or more")
NON_NEG: Rule = (lambda v: v >= 0, ">= 0", "Use 0 to turn it off")


class Checks:
    """Collects rule errors, skipping fields already reported as malformed (a stand-in value)."""

    def __init__(self, bad: list[str]) -> None:
        self.bad, self.errors = bad, []

    def add(self, path: str, message: str, uses: tuple[str, ...] = ()) -> None:
        """Record an error at `path`; `uses` names other fields the rule read."""

        def under(p: str, b: str) -> bool:
            return p == b or p.startswith((b + ".", b + "["))

        if not any(under(p, b) for p in (path, *uses) for b in self.bad):
            self.errors.append((path, message))

    def limits(self, path: str, obj: Any, rules: dict[str, Rule]) -> None:
        for name, (ok, requirement, fix) in rules.items():
            value = getattr(obj, name)
            if not ok(value):
                self.add(f"{path}.{name}", f"must be {requirement}, got {value!r}. {fix}")

    def name(self, path: str, name: str, kind: str) -> None:
        if not _NAME.match(name):
            self.add(
                path, f"{kind} name {name!r} may only use letters, digits, '.', '-', '_'. Rename it"
            )


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a repeated key is almost always a typo."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass

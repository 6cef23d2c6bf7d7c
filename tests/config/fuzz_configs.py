"""A valid run config and hypothesis strategies that make one mistake in it.

The mistakes are found from the schema (atgrpo.config's dataclasses), not listed by hand: a value
of the wrong type at any field or section, an unknown key in any section, or a number outside
the range the field allows. Each mutation reports the dotted path it broke, which the
ConfigError must name.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
from typing import Any, Literal, Union, get_args, get_origin

from hypothesis import strategies as st

from atgrpo.config import RunConfig, parse_config
from atgrpo.config_parse import section_types

BASE = {
    "run": {
        "name": "fuzz-run",
        "steps": 2,
        "tasks_per_step": 2,
        "eval_every_steps": 0,
        "checkpoint_every_steps": 0,
        "run_dir": "runs/fuzz-run",
    },
    "env": {
        "name": "toy",
        "turn_order": ["speaker", "listener"],
        "max_turns": 2,
        "options": {"digits": 10},
    },
    "pools": {
        "shared": {
            "model_path": "models/tiny",
            "device": "cpu",
            "dtype": "float32",
            "optim": {"lr": 5e-4, "warmup_steps": 0},
        }
    },
    "agents": {
        "speaker": {"pool": "shared", "train_sampling": {"max_tokens": 4}},
        "listener": {
            "pool": "shared",
            "train_sampling": {"max_tokens": 4},
            "system_prompt": "Say the digit.",
        },
    },
    "algorithm": {"k": 2, "mini_batch_size": 4},
}


def valid_config(services: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every field written out (defaults included), so every field can be broken."""
    data = copy.deepcopy(BASE)
    if services:
        data["services"] = services
    plain = parse_config(data).to_dict()
    plain["agents"]["listener"]["system_prompt"] = "Say the digit."
    return plain


# A number outside the allowed range, by the field's last path component(s).
def _outside(lo: float, hi: float, *, lo_open: bool, hi_open: bool) -> st.SearchStrategy[float]:
    below = st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False, allow_infinity=False)
    above = st.floats(min_value=hi, exclude_min=not hi_open, allow_nan=False, allow_infinity=False)
    return st.one_of(below, above)


_POSITIVE_INTS = st.integers(max_value=0)
_NON_NEG_INTS = st.integers(max_value=-1)
RANGES: dict[str, st.SearchStrategy] = {
    **dict.fromkeys(
        [
            "k",
            "epochs",
            "mini_batch_size",
            "steps",
            "tasks_per_step",
            "max_turns",
            "max_tokens",
            "max_prompt_tokens",
            "rollout_replicas",
            "micro_batch_tokens",
            "lora.rank",
        ],
        _POSITIVE_INTS,
    ),
    **dict.fromkeys(
        ["eval_every_steps", "checkpoint_every_steps", "eval_tasks", "warmup_steps"], _NON_NEG_INTS
    ),
    "top_k": st.integers(max_value=0).filter(lambda v: v != -1),
    "temperature": st.floats(max_value=-1e-9, allow_infinity=False),
    "top_p": _outside(0, 1, lo_open=True, hi_open=False),
    **dict.fromkeys(
        ["lr", "grad_clip", "lora.alpha"], st.floats(max_value=0, allow_infinity=False)
    ),
    **dict.fromkeys(
        ["weight_decay", "kl_coef", "entropy_coef"],
        st.floats(max_value=-1e-9, allow_infinity=False),
    ),
    "min_lr_ratio": _outside(0, 1, lo_open=False, hi_open=False),
    **dict.fromkeys(["clip_eps_low", "clip_eps_high"], _outside(0, 1, lo_open=True, hi_open=True)),
    "dual_clip_c": st.floats(max_value=1, allow_infinity=False),
    "dropout": _outside(0, 1, lo_open=False, hi_open=True),
    "betas": _outside(0, 1, lo_open=False, hi_open=True),  # the first of the two
}

_NOT_A_NUMBER_TEXT = st.text(alphabet="abcxyz_ -", min_size=1, max_size=8)
_SCALARS = {
    "str": st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans()),
    "int": st.one_of(_NOT_A_NUMBER_TEXT, st.floats(allow_nan=False), st.booleans(), st.just("7")),
    "float": st.one_of(
        _NOT_A_NUMBER_TEXT, st.booleans(), st.sampled_from([math.nan, math.inf, -math.inf])
    ),
    "bool": st.one_of(st.integers(), _NOT_A_NUMBER_TEXT, st.just("yes")),
}
_CONTAINERS = st.one_of(
    st.lists(st.integers(), max_size=2), st.dictionaries(st.just("x"), st.integers(), max_size=1)
)


@dataclasses.dataclass(frozen=True)
class Site:
    path: tuple[Any, ...]  # keys into the config dict
    tp: Any  # the schema type there

    @property
    def dotted(self) -> str:
        return ".".join(str(p) for p in self.path)


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(the type without Optional, whether None is allowed)."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(get_args(tp))
    return tp, False


def sites(data: Any, tp: Any = RunConfig, path: tuple = ()) -> list[Site]:
    """Every field and section of `data` (a valid config) with its schema type."""
    out = [Site(path, tp)] if path else []
    inner, _ = _unwrap(tp)
    if dataclasses.is_dataclass(inner):
        hints = section_types(inner)
        for name, value in data.items():
            out += sites(value, hints[name], (*path, name))
    elif get_origin(inner) is dict and get_args(inner)[1] is not Any:
        for key, value in data.items():
            out += sites(value, get_args(inner)[1], (*path, key))
    return out


def wrong_type(tp: Any) -> st.SearchStrategy:
    inner, nullable = _unwrap(tp)
    choices = [] if nullable else [st.none()]
    origin = get_origin(inner)
    if origin is Literal:
        options = get_args(inner)
        choices += [st.text(max_size=8).filter(lambda v: v not in options), st.integers()]
    elif inner in (str, int, float, bool):
        choices.append(_SCALARS[inner.__name__])
        choices.append(_CONTAINERS)
    elif origin is tuple:
        item = get_args(inner)[0]
        bad_item = _SCALARS[item.__name__] if item in (str, int, float, bool) else st.integers()
        choices += [
            st.integers(),
            st.text(min_size=1, max_size=5),
            st.lists(bad_item, min_size=1, max_size=2),
        ]
    else:  # a section (dataclass) or a mapping
        choices += [st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2)]
    return st.one_of(*choices)


def _range_for(site: Site) -> st.SearchStrategy | None:
    names = [".".join(str(p) for p in site.path[-2:]), str(site.path[-1])]
    # the team-reward weight: any number
    free = site.path[0] == "algorithm" and site.path[-1] == "alpha"
    for name in names:
        if name in RANGES and not free:
            return RANGES[name]
    inner, _ = _unwrap(site.tp)
    if inner is float:
        return st.sampled_from([math.nan, math.inf, -math.inf])
    return None


@st.composite
def mutations(draw, base: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
    """(a broken copy of `base`, the dotted path of the mistake, what kind of mistake)."""
    all_sites = sites(base)
    kind = draw(st.sampled_from(["type", "unknown_key", "range"]))
    data = copy.deepcopy(base)
    if kind == "unknown_key":
        sections = [Site((), RunConfig)] + [
            s for s in all_sites if dataclasses.is_dataclass(_unwrap(s.tp)[0])
        ]
        site = draw(st.sampled_from(sections))
        fields = set(section_types(_unwrap(site.tp)[0]))
        key = draw(
            st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(lambda k: k not in fields)
        )
        target = data
        for p in site.path:
            target = target[p]
        target[key] = draw(st.one_of(st.integers(), st.text(max_size=5)))
        return data, ".".join(str(p) for p in (*site.path, key)), kind
    if kind == "range":
        ranged = [(s, r) for s in all_sites if (r := _range_for(s)) is not None]
        site, values = draw(st.sampled_from(ranged))
        value = draw(values)
    else:
        site = draw(st.sampled_from(all_sites))
        value = draw(wrong_type(site.tp))
    target = data
    for p in site.path[:-1]:
        target = target[p]
    if site.path[-1] == "betas" and kind == "range":
        value = [value, 0.999]
    target[site.path[-1]] = value
    return data, site.dotted, kind

"""What atgrpo exports, read from the code, and the metric names a PromQL expression uses.

The services define every metric in one module each (listed below); importing them fills
prometheus_client's default registry, whose families give each series name a scrape shows
(a counter `x` scrapes as `x_total`, a histogram as `x_bucket`, `x_sum`, `x_count`).
"""

from __future__ import annotations

import importlib
import re

from prometheus_client import REGISTRY

METRIC_MODULES = (
    "atgrpo.rpc.interceptors",
    "atgrpo.rpc.main",
    "atgrpo.sdk.metrics",
    "sandbox_svc.metrics",
    "rollout_svc.metrics",
    "trainer_svc.metrics",
    "router_svc.metrics",
)
# Series that come from elsewhere: Prometheus' own per-target `up`, and the sandbox's warning
# gauge, registered by sandbox_svc/__main__.py only when it runs with --unsafe-no-isolation.
OTHER_SERIES = {"up": None, "atgrpo_sandbox_isolation_disabled": "sandbox_svc/__main__.py"}

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}


def exported_families() -> dict[str, str]:
    """Every metric family the services' metrics modules define: name -> type."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    return {f.name: f.type for f in REGISTRY.collect()}


def series_names(family: str, kind: str) -> set[str]:
    return {family + suffix for suffix in _SUFFIXES[kind]}


def exported_series() -> set[str]:
    """Every series name a scrape of an atgrpo service can show, plus OTHER_SERIES."""
    return {
        n for name, kind in exported_families().items() for n in series_names(name, kind)
    } | set(OTHER_SERIES)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_WORD = re.compile(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    label names, label values, durations or numbers."""
    s = _STRING.sub('""', expr)
    s = _MATCHERS.sub(" ", s)
    s = _RANGES.sub(" ", s)
    s = _LABEL_LISTS.sub(" ", s)
    names = set()
    for m in _WORD.finditer(s):
        if s[m.end() :].lstrip().startswith("(") or m.group().lower() in _KEYWORDS:
            continue
        names.add(m.group())
    return names

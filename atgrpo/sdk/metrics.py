"""The environment service's Prometheus metrics (atgrpo_env_<what>_<unit>, DESIGN.md §4).

Defined here, once, for every EnvHost: env_svc's built-in environments and a third-party class
served with `atgrpo env serve` report the same series. host.py and store.py hold one-line hooks.
"""

from __future__ import annotations

import weakref
from collections import Counter as Tally
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from atgrpo.sdk.store import EpisodeStore

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

STEP_SECONDS = Histogram(
    "atgrpo_env_step_seconds",
    "Time of one Step (the environment's step, sandbox runs included), by environment.",
    ["env"],
    buckets=_LATENCY,
)
FORK_SECONDS = Histogram(
    "atgrpo_env_fork_seconds",
    "Time of one Fork (all its copies), by environment.",
    ["env"],
    buckets=_LATENCY,
)
RESETS = Counter("atgrpo_env_resets_total", "Episodes started (Reset), by environment.", ["env"])
JUDGE_ERRORS = Counter(
    "atgrpo_env_judge_errors_total",
    "Answers a judge refused to judge (a format "
    "failure: too large, too deep, not data, a scorer that failed), by environment "
    "and reason; a policy drifting into malformed or hostile answers shows here.",
    ["env", "reason"],
)

_stores: weakref.WeakSet[EpisodeStore] = weakref.WeakSet()
_started: set[str] = set()  # envs that have had an episode in this process


class _LiveEpisodes:
    """atgrpo_env_live_episodes{env}: counted from the stores at scrape time, so it can never
    drift from what the store holds (episodes also leave by expiry, not only by Close)."""

    def collect(self):
        g = GaugeMetricFamily(
            "atgrpo_env_live_episodes",
            "Episodes held in memory now, by environment.",
            labels=["env"],
        )
        tally: Tally[str] = Tally()
        for store in list(_stores):
            # A copy first: the scrape runs in the metrics thread while the event loop mutates.
            tally.update(e.env_name for e in list(store._episodes.values()))
        for env in sorted(_started | set(tally)):  # an env whose episodes all closed reads 0
            g.add_metric([env], tally[env])
        yield g


REGISTRY.register(_LiveEpisodes())


def episode_started(env: str) -> None:
    RESETS.labels(env).inc()
    _started.add(env)


def judged(env: str, info: dict) -> None:
    """Count a step whose info carries a judge error (atgrpo.sdk.judge.failure_info)."""
    reason = info.get("judge_error")
    if isinstance(reason, str) and reason:
        JUDGE_ERRORS.labels(env, reason if len(reason) <= 32 else "other").inc()


def track_store(store: EpisodeStore) -> None:
    """Count `store`'s episodes in atgrpo_env_live_episodes for as long as it exists."""
    _stores.add(store)

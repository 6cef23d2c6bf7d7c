"""The rollout service's Prometheus metrics (atgrpo_rollout_<what>_<unit>, DESIGN.md §4).

Defined here, once; pool.py reports each engine batch, each weight swap, each out-of-memory retry
and each failed request with one call.
Generated tokens are a counter: tokens per second is `rate(atgrpo_rollout_generated_tokens_total[1m])`.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

GENERATED_TOKENS = Counter("atgrpo_rollout_generated_tokens_total", "Completion tokens generated, by pool.",
                           ["pool"])
COMPLETIONS = Counter("atgrpo_rollout_completions_total", "Completions generated (n per request), by pool.",
                      ["pool"])
GENERATE_SECONDS = Histogram("atgrpo_rollout_generate_seconds",
                             "Time of one engine batch (all its requests' completions), by pool.", ["pool"],
                             buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
BATCH_ROWS = Histogram("atgrpo_rollout_batch_rows", "Sequences generated in one engine batch, by pool.", ["pool"],
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
OOM_RETRIES = Counter("atgrpo_rollout_oom_retries_total",
                      "Engine batches that ran out of memory and were run again as two smaller pieces, by pool.",
                      ["pool"])
FAILED_REQUESTS = Counter("atgrpo_rollout_failed_requests_total",
                          "Generation requests the engine failed, by pool and error (InvalidArgument: a bad "
                          "request; ResourceExhausted: out of memory even alone; Unavailable: the engine failed).",
                          ["pool", "error"])
POLICY_VERSION = Gauge("atgrpo_rollout_policy_version",
                       "Weights version served, by pool and adapter (\"\" = the full model).", ["pool", "adapter"])


def observe_batch(pool: str, outs: Sequence[Sequence], seconds: float) -> None:
    """One engine batch: `outs[i]` are request i's completions (each with .token_ids)."""
    completions = [c for per_request in outs for c in per_request]
    GENERATE_SECONDS.labels(pool).observe(seconds)
    BATCH_ROWS.labels(pool).observe(len(completions))
    COMPLETIONS.labels(pool).inc(len(completions))
    GENERATED_TOKENS.labels(pool).inc(sum(len(c.token_ids) for c in completions))


def register_pool(pool: str) -> None:
    """The pool's failure counters exist from the start, at 0: a dashboard then shows "none yet"
    instead of "no data", and increase() sees the first failure."""
    OOM_RETRIES.labels(pool)
    for error in ("InvalidArgument", "ResourceExhausted", "Unavailable"):
        FAILED_REQUESTS.labels(pool, error)


def count_oom_retry(pool: str) -> None:
    OOM_RETRIES.labels(pool).inc()


def count_failed(pool: str, error: str) -> None:
    FAILED_REQUESTS.labels(pool, error).inc()


def set_versions(pool: str, versions: dict[str, int]) -> None:
    for adapter, version in versions.items():
        POLICY_VERSION.labels(pool, adapter).set(version)

"""The rollout service's Prometheus metrics (atgrpo_rollout_<what>_<unit>, DESIGN.md §4).

Defined here, once; pool.py reports each engine batch, each weight swap, each out-of-memory retry
and each failed request with one call.
Generated tokens are a counter: tokens per second is
`rate(atgrpo_rollout_generated_tokens_total[1m])`.

The state of each pool (requests queued and generating, the engine's KV cache and sequences, the
time its engine has been busy) and the GPU memory are read when Prometheus scrapes, by a collector
(PoolCollector): from counters the pool keeps and the engine's optional `stats()`, which reads what
the engine already has and never waits on it, so a scrape answers while a batch generates.
The replica's busy fraction is `rate(atgrpo_rollout_busy_seconds_total[1m])` (each replica is its
own scrape target: `instance` tells them apart).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

GENERATED_TOKENS = Counter(
    "atgrpo_rollout_generated_tokens_total", "Completion tokens generated, by pool.", ["pool"]
)
COMPLETIONS = Counter(
    "atgrpo_rollout_completions_total", "Completions generated (n per request), by pool.", ["pool"]
)
GENERATE_SECONDS = Histogram(
    "atgrpo_rollout_generate_seconds",
    "Time of one engine batch (all its requests' completions), by pool.",
    ["pool"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
BATCH_ROWS = Histogram(
    "atgrpo_rollout_batch_rows",
    "Sequences generated in one engine batch, by pool.",
    ["pool"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
OOM_RETRIES = Counter(
    "atgrpo_rollout_oom_retries_total",
    "Engine batches that ran out of memory and were run again as two smaller pieces, by pool.",
    ["pool"],
)
FAILED_REQUESTS = Counter(
    "atgrpo_rollout_failed_requests_total",
    "Generation requests the engine failed, by pool and error (InvalidArgument: a bad "
    "request; ResourceExhausted: out of memory even alone; Unavailable: the engine failed).",
    ["pool", "error"],
)
POLICY_VERSION = Gauge(
    "atgrpo_rollout_policy_version",
    'Weights version served, by pool and adapter ("" = the full model).',
    ["pool", "adapter"],
)
HTTP_REQUESTS = Counter(
    "atgrpo_rollout_http_requests_total",
    "Requests to the OpenAI-compatible HTTP port, by route and HTTP status code.",
    ["route", "code"],
)
HTTP_SECONDS = Histogram(
    "atgrpo_rollout_http_request_seconds",
    "Time to answer one request of the OpenAI-compatible HTTP port, by route.",
    ["route"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
HTTP_TOKENS = Counter(
    "atgrpo_rollout_http_tokens_total",
    "Tokens of the OpenAI-compatible HTTP port's answers, by pool and kind (prompt: once a "
    "request; completion: every choice's). Generated tokens are also in generated_tokens_total.",
    ["pool", "kind"],
)
# The routes there are, so a scan of paths cannot make a label value each.
HTTP_ROUTES = ("/v1/models", "/v1/chat/completions", "/v1/completions")


def observe_http(route: str, code: int, seconds: float) -> None:
    route = route if route in HTTP_ROUTES else "other"
    HTTP_REQUESTS.labels(route, str(code)).inc()
    HTTP_SECONDS.labels(route).observe(seconds)


def count_http_tokens(
    pool: str, prompt_tokens: int, completion_tokens: int, total_tokens: int = 0
) -> None:
    HTTP_TOKENS.labels(pool, "prompt").inc(prompt_tokens)
    HTTP_TOKENS.labels(pool, "completion").inc(completion_tokens)


def observe_batch(pool: str, outs: Sequence[Sequence], seconds: float) -> None:
    """One engine batch: `outs[i]` are request i's completions (each with .token_ids)."""
    completions = [c for per_request in outs for c in per_request]
    GENERATE_SECONDS.labels(pool).observe(seconds)
    BATCH_ROWS.labels(pool).observe(len(completions))
    COMPLETIONS.labels(pool).inc(len(completions))
    GENERATED_TOKENS.labels(pool).inc(sum(len(c.token_ids) for c in completions))


def register_pool(pool: str, runtime: Any = None) -> None:
    """The pool's failure counters exist from the start, at 0: a dashboard then shows "none yet"
    instead of "no data", and increase() sees the first failure. `runtime` (a PoolRuntime) is
    read at each scrape from now on; a later one of the same name replaces it."""
    if runtime is not None:
        _POOLS[pool] = weakref.ref(runtime)  # weak: a pool dropped (a test's) is not kept alive
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


_POOLS: dict[str, weakref.ref] = {}


class PoolCollector:
    """Each pool's requests, KV cache and engine sequences, and this process's GPU memory, at scrape
    time."""

    def __init__(self) -> None:
        # vLLM's stats() reads prometheus_client's registry, which collects this collector again:
        # inside that nested collect this one yields nothing.
        self._inside = threading.local()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families = self._families()
        if not getattr(self._inside, "value", False):
            self._inside.value = True
            try:
                self._fill(families)
            finally:
                self._inside.value = False
        yield from families.values()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        # Every family is yielded, with no samples when there are none (a CPU process has no GPU
        # memory), so a scrape always lists what this service can export.
        return {
            "running": GaugeMetricFamily(
                "atgrpo_rollout_requests_running",
                "Requests in the engine batch being generated, by pool.",
                labels=["pool"],
            ),
            "waiting": GaugeMetricFamily(
                "atgrpo_rollout_requests_waiting",
                "Requests queued for the pool's engine, by pool.",
                labels=["pool"],
            ),
            "sequences": GaugeMetricFamily(
                "atgrpo_rollout_engine_sequences",
                "Sequences (samples) inside the engine, by pool and state: running, or "
                "waiting (vLLM's scheduler: for KV-cache room; the hf engine's continuous batch: "
                "for their prompt's prefill).",
                labels=["pool", "state"],
            ),
            "busy": CounterMetricFamily(
                "atgrpo_rollout_busy_seconds",
                "Wall seconds the pool's engine spent generating batches or loading "
                "weights (the one in progress counted up to now), by pool: rate() is "
                "the replica's busy fraction.",
                labels=["pool"],
            ),
            "kv": GaugeMetricFamily(
                "atgrpo_rollout_kv_cache_usage_ratio",
                "Share of the engine's KV cache in use, 0 to 1, by pool (vLLM only).",
                labels=["pool"],
            ),
            "allocated": GaugeMetricFamily(
                "atgrpo_gpu_memory_allocated_bytes",
                "GPU memory held by this process's tensors (torch), by device.",
                labels=["device"],
            ),
            "reserved": GaugeMetricFamily(
                "atgrpo_gpu_memory_reserved_bytes",
                "GPU memory this process's torch allocator holds (tensors and its cache), "
                "by device.",
                labels=["device"],
            ),
        }

    @staticmethod
    def _fill(f: dict[str, GaugeMetricFamily | CounterMetricFamily]) -> None:
        for name, ref in dict(_POOLS).items():  # a copy: the event loop may add a pool meanwhile
            runtime = ref()
            if runtime is None:
                continue
            f["running"].add_metric([name], runtime.running)
            f["waiting"].add_metric([name], runtime.waiting)
            f["busy"].add_metric([name], runtime.busy_seconds())
            stats = engine_stats(runtime.engine)
            for state in ("running", "waiting"):
                if f"sequences_{state}" in stats:
                    f["sequences"].add_metric([name, state], stats[f"sequences_{state}"])
            if "kv_cache_usage" in stats:
                f["kv"].add_metric([name], stats["kv_cache_usage"])
        # Only where this process has started CUDA: asking otherwise would start it (and take
        # memory).
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for d in range(torch.cuda.device_count()):
                f["allocated"].add_metric([f"cuda:{d}"], torch.cuda.memory_allocated(d))
                f["reserved"].add_metric([f"cuda:{d}"], torch.cuda.memory_reserved(d))


def engine_stats(engine: Any) -> dict[str, float]:
    """The engine's `stats()`, or {} when it has none or it fails (a scrape must not fail for
    it)."""
    stats = getattr(engine, "stats", None)
    if stats is None:
        return {}
    try:
        return stats()
    except Exception:  # noqa: BLE001 - logged; the rest of the scrape goes on
        log.warning("reading the engine's stats failed", exc_info=True)
        return {}


REGISTRY.register(PoolCollector())

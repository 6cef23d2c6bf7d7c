"""The trainer's Prometheus metrics (atgrpo_trainer_<what>_<unit>, DESIGN.md §4), per run and pool.

Defined here, once; trainer.py reports each update and each weight push with one call. Gauges
hold the last update's values (a Train call is one step of the run); counters accumulate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram

_POOL = ["run", "pool"]

POLICY_VERSION = Gauge(
    "atgrpo_trainer_policy_version", "Weights version of the pool (bumped by each update).", _POOL
)
LOSS = Gauge(
    "atgrpo_trainer_loss", "Clipped surrogate loss of the last update (token mean).", _POOL
)
APPROX_KL = Gauge(
    "atgrpo_trainer_approx_kl",
    "Approximate KL(old || new) of the last update; old is the "
    "sampler's policy, or with max_staleness >= 1 the trainer's own before the update.",
    _POOL,
)
CLIP_RATIO = Gauge(
    "atgrpo_trainer_clip_ratio",
    "Fraction of tokens whose ratio was clipped in the last update.",
    _POOL,
)
GRAD_NORM = Gauge(
    "atgrpo_trainer_grad_norm",
    "Gradient norm before clipping, mean over the last update's optimizer steps.",
    _POOL,
)
ENTROPY = Gauge(
    "atgrpo_trainer_entropy_nats", "Mean token entropy of the policy in the last update.", _POOL
)
KL_REF = Gauge(
    "atgrpo_trainer_kl_ref",
    "k3 KL of the policy to the frozen reference in the last update (0 when kl_coef is 0).",
    _POOL,
)
STALENESS = Gauge(
    "atgrpo_trainer_staleness_max",
    "Versions between the weights the last update started from "
    "and the oldest weights its samples were drawn with.",
    _POOL,
)
SAMPLE_STALENESS = Histogram(
    "atgrpo_trainer_sample_staleness",
    "Versions each trained sample's weights lagged "
    "the pool's when its update started (0: on-policy).",
    _POOL,
    buckets=(0, 1, 2, 3, 4, 8, 16),
)
BUSY_SECONDS = Counter(
    "atgrpo_trainer_busy_seconds_total",
    "Wall seconds spent in Train calls' updates and weight "
    "pushes; its rate is the fraction of time the trainer is busy.",
    _POOL,
)
# The rollout engine's log-probs against the trainer's own (issue 59; atgrpo.algo.mismatch), set
# only by updates that scored the trainer's (behav_imp_cap > 0 or max_staleness > 0).
MISMATCH_KL = Gauge(
    "atgrpo_trainer_mismatch_kl",
    "k3 estimate of KL(engine || trainer) per token in the last update, on the tokens both give "
    "a finite log-prob.",
    _POOL,
)
MISMATCH_OUTSIDE = Gauge(
    "atgrpo_trainer_mismatch_outside_support_ratio",
    "Fraction of the last update's tokens the engine sampled but the trainer's sampling "
    "transform (top-k/top-p) excludes; left out of the loss.",
    _POOL,
)
MISMATCH_RATIO = Gauge(
    "atgrpo_trainer_mismatch_ratio",
    "Quantiles (label q: 0.05, 0.5, 0.95) of exp(trainer - engine log-prob) over the last "
    "update's tokens.",
    # `q`, not `quantile`: Prometheus reserves that label for summaries (promtool refuses it here)
    [*_POOL, "q"],
)
MISMATCH_CAPPED = Gauge(
    "atgrpo_trainer_mismatch_capped_ratio",
    "Fraction of the last update's tokens whose importance weight was truncated at behav_imp_cap.",
    _POOL,
)
MASKED_TOKENS = Counter(
    "atgrpo_trainer_masked_tokens_total",
    "Response tokens left out of the loss because "
    "a log-prob was -inf (the sampler's and trainer's top-k/top-p masks disagreed).",
    _POOL,
)
UPDATES = Counter(
    "atgrpo_trainer_updates_total", "Updates (Train calls that trained; replays excluded).", _POOL
)
UPDATE_SECONDS = Histogram(
    "atgrpo_trainer_update_seconds",
    "Time of one update, weight push excluded.",
    _POOL,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
TRAINED_SAMPLES = Counter(
    "atgrpo_trainer_samples_total", "Samples trained on, by agent.", [*_POOL, "agent"]
)
TRAINED_TOKENS = Counter(
    "atgrpo_trainer_tokens_total", "Response tokens trained on, by agent.", [*_POOL, "agent"]
)
PUSH_SECONDS = Histogram(
    "atgrpo_trainer_weight_push_seconds",
    "Time to push new weights to every rollout replica of the pool.",
    _POOL,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
PUSH_BYTES = Counter(
    "atgrpo_trainer_weight_push_bytes_total",
    "Weight bytes acknowledged by rollout replicas (all replicas summed).",
    _POOL,
)
PUSH_FAILURES = Counter(
    "atgrpo_trainer_weight_push_failures_total",
    "Weight pushes that failed (a replica refused the weights).",
    _POOL,
)
REPLICAS_LOST = Counter(
    "atgrpo_trainer_replicas_lost",
    "Rollout replicas left out of a push or sync because they were gone or died mid-load; the "
    "router syncs each again before giving it work.",
    _POOL,
)


def set_version(run: str, pool: str, version: int) -> None:
    POLICY_VERSION.labels(run, pool).set(version)


def observe_update(
    run: str,
    pool: str,
    version: int,
    m: Mapping[str, float],
    agents: Mapping[str, Mapping[str, float]],
    *,
    staleness: Sequence[int] = (),
    busy_seconds: float = 0.0,
) -> None:
    """One update: `m` is the TrainResult's metrics, `agents` its per-agent samples and tokens,
    `staleness` each trained sample's lag in versions, `busy_seconds` the update's and push's
    wall time."""
    set_version(run, pool, version)
    for gauge, key in (
        (LOSS, "loss"),
        (APPROX_KL, "approx_kl"),
        (CLIP_RATIO, "clip_fraction"),
        (GRAD_NORM, "grad_norm"),
        (ENTROPY, "entropy"),
        (KL_REF, "kl_ref"),
        (STALENESS, "staleness_max"),
    ):
        if key in m:
            gauge.labels(run, pool).set(m[key])
    _observe_mismatch(run, pool, m)
    UPDATES.labels(run, pool).inc()
    MASKED_TOKENS.labels(run, pool).inc(m.get("masked_tokens", 0.0))
    if "train_seconds" in m:
        UPDATE_SECONDS.labels(run, pool).observe(m["train_seconds"])
    for lag in staleness:
        SAMPLE_STALENESS.labels(run, pool).observe(lag)
    BUSY_SECONDS.labels(run, pool).inc(busy_seconds)
    for agent, a in agents.items():
        TRAINED_SAMPLES.labels(run, pool, agent).inc(a.get("samples", 0.0))
        TRAINED_TOKENS.labels(run, pool, agent).inc(a.get("tokens", 0.0))


def _observe_mismatch(run: str, pool: str, m: Mapping[str, float]) -> None:
    for gauge, key in (
        (MISMATCH_KL, "mismatch_kl"),
        (MISMATCH_OUTSIDE, "mismatch_outside_support"),
        (MISMATCH_CAPPED, "mismatch_capped_fraction"),
    ):
        if key in m:
            gauge.labels(run, pool).set(m[key])
    for q, label in (("05", "0.05"), ("50", "0.5"), ("95", "0.95")):
        if (key := f"mismatch_ratio_p{q}") in m:
            MISMATCH_RATIO.labels(run, pool, label).set(m[key])


def push_failures(run: str, pool: str):
    """A context manager counting an exception out of a push (it still propagates)."""
    return PUSH_FAILURES.labels(run, pool).count_exceptions()


def replicas_lost(run: str, pool: str, count: int) -> None:
    REPLICAS_LOST.labels(run, pool).inc(count)


def observe_push(run: str, pool: str, seconds: float, sent_bytes: int) -> None:
    PUSH_SECONDS.labels(run, pool).observe(seconds)
    PUSH_BYTES.labels(run, pool).inc(sent_bytes)

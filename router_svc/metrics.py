"""The router's Prometheus metrics (atgrpo_router_<what>_<unit>, DESIGN.md §4), per run.

Fed from the event dicts of events.py (step_event, eval_event) as RunLoop records them, so the
metrics, metrics.jsonl and WatchRun never disagree; and from the run's state changes (runs.py).
Per agent: reward, success, turns (split="train" for the step's tree rollouts, "eval" for the
evaluation), groups, group size, zero-variance fraction, advantages. Per run: the step's time
split into rollout, train and weight sync, and when the last step completed (the no-progress alert).
Per pool, what the router decides (asynchronous training, algorithm.max_staleness): samples dropped
as too stale, and the staleness of the samples the step trained. Each pool's update (version, loss,
KL, clip fraction, ...) is the trainer's to export.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_AGENT = ["run", "agent"]
_POOL = ["run", "pool"]
_SPLIT = ["run", "agent", "split"]
STATES = ("starting", "running", "stopping", "stopped", "finished", "failed")
PHASES = {
    "rollout": "rollout_seconds",
    "train": "train_seconds",
    "weight_sync": "weight_sync_seconds",
}

RUN_STATE = Gauge(
    "atgrpo_router_run_state", "1 for the run's current state, 0 for the others.", ["run", "state"]
)
COMPLETED_STEP = Gauge("atgrpo_router_completed_step", "The last completed training step.", ["run"])
LAST_STEP_TIME = Gauge(
    "atgrpo_router_last_step_timestamp_seconds",
    "Unix time the last training step completed, or the run (re)started running if later.",
    ["run"],
)
STEPS = Counter("atgrpo_router_steps_total", "Training steps completed by this router.", ["run"])
STEP_SECONDS = Histogram(
    "atgrpo_router_step_seconds",
    "Wall time of one training step.",
    ["run"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
)
PHASE_SECONDS = Histogram(
    "atgrpo_router_step_phase_seconds",
    "A step's time by phase: rollout (collection), train (updates), weight_sync "
    "(the slowest pool's weight push).",
    ["run", "phase"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)

REWARD = Gauge(
    "atgrpo_router_reward_mean",
    "Mean training reward (alpha*team + local) of the agent's "
    "samples (train), or its mean episode reward (eval).",
    _SPLIT,
)
SUCCESS = Gauge(
    "atgrpo_router_success_ratio",
    "Fraction of episodes that succeeded (the team's, reported for each agent).",
    _SPLIT,
)
TURNS = Gauge("atgrpo_router_turns_mean", "Mean turns per episode.", _SPLIT)
EPISODES = Counter("atgrpo_router_episodes_total", "Episodes finished, by split.", ["run", "split"])
FAILED_EPISODES = Counter(
    "atgrpo_router_failed_episodes_total",
    "Episodes that ended in an error, by split.",
    ["run", "split"],
)

ROLLBACKS = Counter(
    "atgrpo_router_rollbacks_total",
    "Times the run went back to its last checkpoint (a trainer restarted and lost its weights).",
    ["run"],
)
REDONE_STEPS = Counter(
    "atgrpo_router_redone_steps_total",
    "Completed steps undone by rollbacks, to be trained "
    "again (the cost of checkpoint_every_steps).",
    ["run"],
)

SAMPLES = Counter(
    "atgrpo_router_samples_total", "Samples collected, by agent (before filters).", _AGENT
)
DROPPED = Counter(
    "atgrpo_router_dropped_samples_total",
    "Samples dropped by the filters (zero-variance groups).",
    ["run"],
)
GROUPS = Gauge(
    "atgrpo_router_groups", "Advantage groups (task, agent, turn) in the last step.", _AGENT
)
GROUP_SIZE = Gauge(
    "atgrpo_router_group_size_mean",
    "Mean samples per group in the last step (K unless branches failed).",
    _AGENT,
)
ZERO_VARIANCE = Gauge(
    "atgrpo_router_zero_variance_ratio",
    "Fraction of the last step's groups whose rewards "
    "were all equal (advantage 0: no learning signal).",
    _AGENT,
)
ADV_MEAN = Gauge(
    "atgrpo_router_advantage_mean",
    "Mean advantage of the agent's trained samples, last step.",
    _AGENT,
)
ADV_STD = Gauge(
    "atgrpo_router_advantage_std", "Standard deviation of those advantages, last step.", _AGENT
)

STALE_DROPPED = Counter(
    "atgrpo_router_stale_samples_dropped_total",
    "Samples dropped as too stale (drawn more than max_staleness versions before the "
    "update that would train them), their tasks collected again, by pool.",
    _POOL,
)

REPLICAS = Gauge(
    "atgrpo_router_rollout_replicas",
    "Rollout replicas the last collection ran on (those serving the run's weights), by pool.",
    _POOL,
)
REQUEUED = Counter(
    "atgrpo_router_tasks_requeued_total",
    "Tasks collected again on another replica after theirs was lost mid-collection.",
    ["run"],
)


def observe_collect(run: str, replicas: Mapping[str, int], requeued: int) -> None:
    for pool, n in replicas.items():
        REPLICAS.labels(run, pool).set(n)
    REQUEUED.labels(run).inc(requeued)


def observe_state(run: str, state: str) -> None:
    """A run's state changed: its RUN_STATE series for `state` is 1, the others 0. Starting to
    run (or running again after a stop) restarts the no-progress clock."""
    for s in STATES:
        RUN_STATE.labels(run, s).set(1.0 if s == state else 0.0)
    if state == "running":
        LAST_STEP_TIME.labels(run).set(time.time())
    # Counters of things that may never happen exist at 0 from the start: a dashboard's
    # increase() over them then shows 0, not "no data", for a run without rollbacks.
    ROLLBACKS.labels(run).inc(0)
    REDONE_STEPS.labels(run).inc(0)
    REQUEUED.labels(run).inc(0)


def observe_event(run: str, event: Mapping[str, Any]) -> None:
    """A step, eval or rollback event of events.py (other kinds are ignored)."""
    if event.get("kind") == "step":
        _observe_step(run, event)
    elif event.get("kind") == "eval":
        _observe_episodes(run, "eval", event)
    elif event.get("kind") == "rollback":
        ROLLBACKS.labels(run).inc()
        REDONE_STEPS.labels(run).inc(event["from_step"] - event["to_step"])
        COMPLETED_STEP.labels(run).set(event["to_step"])


def _observe_episodes(run: str, split: str, e: Mapping[str, Any]) -> None:
    EPISODES.labels(run, split).inc(e.get("episodes", 0))
    FAILED_EPISODES.labels(run, split).inc(e.get("failed_episodes", 0))
    for agent, a in e.get("agents", {}).items():
        REWARD.labels(run, agent, split).set(a["reward_mean"])
        TURNS.labels(run, agent, split).set(a["turns_mean"])
        SUCCESS.labels(run, agent, split).set(a.get("success_rate", e["success_rate"]))


def _observe_step(run: str, e: Mapping[str, Any]) -> None:
    COMPLETED_STEP.labels(run).set(e["step"])
    LAST_STEP_TIME.labels(run).set(e.get("time") or time.time())
    STEPS.labels(run).inc()
    if "step_seconds" in e:
        STEP_SECONDS.labels(run).observe(e["step_seconds"])
    for phase, key in PHASES.items():
        if key in e:
            PHASE_SECONDS.labels(run, phase).observe(e[key])
    DROPPED.labels(run).inc(e.get("dropped_samples", 0))
    _observe_episodes(run, "train", e)
    for agent, a in e.get("agents", {}).items():
        SAMPLES.labels(run, agent).inc(a["samples"])
        GROUPS.labels(run, agent).set(a["groups"])
        GROUP_SIZE.labels(run, agent).set(a["samples"] / a["groups"] if a["groups"] else 0.0)
        ZERO_VARIANCE.labels(run, agent).set(a["zero_variance_fraction"])
        ADV_MEAN.labels(run, agent).set(a["advantage_mean"])
        ADV_STD.labels(run, agent).set(a["advantage_std"])
    for pool, p in e.get("pools", {}).items():
        # inc(0) too: the series exists at 0 for a synchronous run (or an async one that dropped
        # none)
        STALE_DROPPED.labels(run, pool).inc(p.get("dropped_stale", 0))

"""The metrics modules' hooks, in process: the values an alert or a panel relies on."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from atgrpo.sdk import metrics as env_metrics
from atgrpo.sdk.store import EpisodeStore
from router_svc import metrics as router_metrics


def sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_run_state_has_one_current_state_and_running_restarts_the_clock(monkeypatch):
    monkeypatch.setattr(router_metrics.time, "time", lambda: 1000.0)
    router_metrics.observe_state("unit-run", "running")
    assert sample("atgrpo_router_last_step_timestamp_seconds", run="unit-run") == 1000.0
    router_metrics.observe_event(
        "unit-run",
        {
            "kind": "step",
            "step": 1,
            "time": 1500.0,
            "success_rate": 0.5,
            "episodes": 2,
            "failed_episodes": 0,
            "dropped_samples": 0,
            "agents": {
                "a": {
                    "reward_mean": 0.5,
                    "success_rate": 0.5,
                    "turns_mean": 1.0,
                    "samples": 8,
                    "groups": 0,
                    "zero_variance_fraction": 0.0,
                    "advantage_mean": 0.0,
                    "advantage_std": 0.0,
                }
            },
        },
    )
    assert sample("atgrpo_router_last_step_timestamp_seconds", run="unit-run") == 1500.0
    # no groups: no division
    assert sample("atgrpo_router_group_size_mean", run="unit-run", agent="a") == 0.0
    router_metrics.observe_state("unit-run", "finished")
    states = {
        s: sample("atgrpo_router_run_state", run="unit-run", state=s) for s in router_metrics.STATES
    }
    assert states == {s: float(s == "finished") for s in router_metrics.STATES}
    monkeypatch.setattr(router_metrics.time, "time", lambda: 9000.0)
    router_metrics.observe_state("unit-run", "running")  # resumed much later: not "stuck" at once
    assert sample("atgrpo_router_last_step_timestamp_seconds", run="unit-run") == 9000.0


def test_stale_samples_dropped_and_staleness_max_per_pool():
    """Asynchronous training: a step's per-pool dropped_stale adds up, staleness_max is the last
    step's; a pool that reports no dropped_stale (a synchronous run) still has its counter, at 0."""

    def step(n, pools):
        return {
            "kind": "step",
            "step": n,
            "success_rate": 0.0,
            "episodes": 0,
            "failed_episodes": 0,
            "dropped_samples": 0,
            "agents": {},
            "pools": pools,
        }

    router_metrics.observe_event(
        "stale-run",
        step(1, {"a": {"staleness_max": 2, "dropped_stale": 3}, "b": {"staleness_max": 0}}),
    )
    router_metrics.observe_event(
        "stale-run",
        step(2, {"a": {"staleness_max": 1, "dropped_stale": 4}, "b": {"staleness_max": 0}}),
    )
    assert sample("atgrpo_router_stale_samples_dropped_total", run="stale-run", pool="a") == 7
    assert sample("atgrpo_router_stale_samples_dropped_total", run="stale-run", pool="b") == 0


def test_live_episodes_follow_the_store():
    class Env:
        def fork(self):
            return Env()

    store = EpisodeStore()
    env_metrics.episode_started("unit-env")
    episodes = store.add("unit-env", Env(), count=3)
    assert sample("atgrpo_env_live_episodes", env="unit-env") == 3
    store.remove([episodes[0].id])
    assert sample("atgrpo_env_live_episodes", env="unit-env") == 2
    del store, episodes  # a dropped store counts no more
    assert sample("atgrpo_env_live_episodes", env="unit-env") == 0


def test_a_refused_push_is_a_failure_and_a_gone_replica_a_loss(monkeypatch):
    """A replica that refuses the weights fails the push (counted); one that cannot be reached is
    left out of the pool's list and counted as lost, and the push stands for the others."""
    import rollout_svc.client
    from atgrpo.contract.rollout import RolloutInfo
    from atgrpo.contract.trainer import PoolSpec
    from atgrpo.errors import InvalidArgument, Unavailable
    from trainer_svc.trainer import Trainer

    class Ops:  # just what _push asks the pool for
        state = None

        def weights(self, agents):
            return [("", {}, None)]

    class Replica:  # named by its address: "gone-*" cannot be reached, "refuses-*" says no
        def __init__(self, address):
            self.address = address

        async def get_info_within(self, timeout_s):
            if self.address.startswith("gone"):
                raise Unavailable(f"{self.address} is unreachable")
            return RolloutInfo("hf", "cpu", ())

        async def load_weights(self, *args, **kwargs):
            if self.address.startswith("refuses"):
                raise InvalidArgument("not this model's weights")
            return SimpleNamespace(bytes_received=10)

        async def close(self):
            pass

    # push_weights (the rollout service's client) makes the replicas' clients
    monkeypatch.setattr(rollout_svc.client, "RolloutClient", Replica)
    trainer = Trainer("p")
    trainer.ops = Ops()

    def state(*addresses):
        spec = PoolSpec("unit-run", "p", "/m", ("a",), rollout_addresses=addresses)
        return SimpleNamespace(version=1, spec=spec)

    labels = dict(run="unit-run", pool="p")
    failures = sample("atgrpo_trainer_weight_push_failures_total", **labels) or 0.0
    lost = sample("atgrpo_trainer_replicas_lost_total", **labels) or 0.0
    with pytest.raises(InvalidArgument):
        asyncio.run(trainer._push(state("ok-0:1", "refuses-1:1"), []))
    assert sample("atgrpo_trainer_weight_push_failures_total", **labels) == failures + 1
    assert not sample("atgrpo_trainer_weight_push_seconds_count", **labels)

    pool = state("ok-0:1", "gone-1:1", "ok-2:1")
    assert asyncio.run(trainer._push(pool, []))[1] == 20  # the two replicas still there
    assert pool.spec.rollout_addresses == ("ok-0:1", "ok-2:1")
    assert sample("atgrpo_trainer_replicas_lost_total", **labels) == lost + 1
    assert sample("atgrpo_trainer_weight_push_failures_total", **labels) == failures + 1


def test_an_update_observes_each_samples_staleness_and_the_busy_seconds():
    from trainer_svc import metrics as trainer_metrics

    labels = dict(run="unit-run", pool="stale")
    trainer_metrics.observe_update(
        "unit-run", "stale", 3, {"loss": 0.1}, {}, staleness=[0, 1, 1, 5, 20], busy_seconds=2.5
    )
    trainer_metrics.observe_update("unit-run", "stale", 4, {"loss": 0.1}, {}, busy_seconds=0.5)
    buckets = {
        le: sample("atgrpo_trainer_sample_staleness_bucket", le=le, **labels)
        for le in ("0.0", "1.0", "4.0", "8.0", "16.0", "+Inf")
    }
    assert buckets == {"0.0": 1, "1.0": 3, "4.0": 3, "8.0": 4, "16.0": 4, "+Inf": 5}
    assert sample("atgrpo_trainer_sample_staleness_sum", **labels) == 27
    assert sample("atgrpo_trainer_busy_seconds_total", **labels) == 3.0


def test_an_update_sets_the_mismatch_gauges_only_when_it_measured_them():
    from trainer_svc import metrics as trainer_metrics

    labels = dict(run="unit-run", pool="mismatch")
    figures = dict(
        mismatch_kl=0.0125,
        mismatch_outside_support=0.25,
        mismatch_ratio_p05=0.75,
        mismatch_ratio_p50=1.0,
        mismatch_ratio_p95=1.5,
        mismatch_capped_fraction=0.125,
    )
    trainer_metrics.observe_update("unit-run", "mismatch", 1, {"loss": 0.1, **figures}, {})
    assert sample("atgrpo_trainer_mismatch_kl", **labels) == 0.0125
    assert sample("atgrpo_trainer_mismatch_outside_support_ratio", **labels) == 0.25
    assert sample("atgrpo_trainer_mismatch_capped_ratio", **labels) == 0.125
    assert [
        sample("atgrpo_trainer_mismatch_ratio", q=q, **labels) for q in ("0.05", "0.5", "0.95")
    ] == [0.75, 1.0, 1.5]
    # the correction off: nothing measured, the last values stand (no zeros that read as agreement)
    trainer_metrics.observe_update("unit-run", "mismatch", 2, {"loss": 0.1}, {})
    assert sample("atgrpo_trainer_mismatch_kl", **labels) == 0.0125


def test_the_docs_list_exactly_the_metrics_the_code_defines():
    import re

    from tests.observability.conftest import ROOT
    from tests.observability.exported import OTHER_SERIES, exported_families

    doc = (ROOT / "docs" / "observability.md").read_text()
    rows = dict(re.findall(r"^\| `(atgrpo_\w+)` \| (\w+) \|", doc, flags=re.M))
    families = {
        name: kind for name, kind in exported_families().items() if name.startswith("atgrpo_")
    }
    # a counter's family name lacks the _total its series (and the docs) carry
    defined = {
        name + ("_total" if kind == "counter" else ""): kind for name, kind in families.items()
    }
    defined |= {n: "gauge" for n in OTHER_SERIES if n.startswith("atgrpo_")}
    assert rows == defined

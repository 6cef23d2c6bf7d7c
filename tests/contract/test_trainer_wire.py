"""The trainer's wire conversions give back what went in, and an old client's request gets today's
defaults (atgrpo.contract.trainer_wire)."""

import pytest

from atgrpo._proto.v1 import trainer_pb2 as pb
from atgrpo.contract.trainer import LossConfig, TrainResult, TrainSample, UpdateConfig
from atgrpo.contract.trainer_wire import (
    result_from_pb,
    result_to_pb,
    sample_from_pb,
    sample_to_pb,
    update_from_pb,
    update_to_pb,
)
from atgrpo.errors import InvalidArgument


def test_update_config_round_trips_including_the_async_fields():
    sent = UpdateConfig(
        loss=LossConfig(0.1, 0.28, 4.0, 0.05, 0.01, behav_imp_cap=2.5),
        epochs=3,
        mini_batch_size=7,
        max_staleness=2,
    )
    wire = pb.UpdateParams.FromString(update_to_pb(sent).SerializeToString())
    assert (wire.max_staleness, wire.behav_imp_cap) == (2, 2.5)
    # All of UpdateConfig is the router's and travels; the trainer's own settings do not.
    assert update_from_pb(wire) == sent


def test_an_old_client_gets_the_default_cap_and_a_synchronous_update():
    # A client that predates max_staleness and behav_imp_cap sends neither field (8 and 9).
    old = pb.UpdateParams(
        clip_eps_low=0.2, clip_eps_high=0.2, dual_clip_c=3.0, epochs=1, mini_batch_size=16
    )
    got = update_from_pb(pb.UpdateParams.FromString(old.SerializeToString()))
    assert got.loss.behav_imp_cap == 2.0 == LossConfig().behav_imp_cap  # not the proto's 0.0
    assert got.max_staleness == 0 and got == UpdateConfig()
    # an explicit 0 is kept: the behaviour correction off (issue 59), not the default
    off = update_from_pb(pb.UpdateParams(behav_imp_cap=0.0))
    assert off.loss.behav_imp_cap == 0.0 and not off.trainer_logprobs
    assert off.policy_loss == "ppo_clip" and got.policy_loss == "decoupled"


# what a trainer reports of every update (trainer_svc.trainer.Trainer.train)
METRICS = dict(
    loss=0.5,
    clip_fraction=0.1,
    approx_kl=0.01,
    entropy=2.0,
    train_seconds=1.5,
    push_seconds=0.25,
    grad_norm=0.75,
    tokens=40.0,
    samples=8.0,
    push_bytes=1024.0,
    staleness_max=2.0,
    masked_tokens=1.0,
    staleness_mean=1.25,
    time_forward_s=0.5,
    time_backward_s=1.0,
    time_optimizer_s=0.25,
    update_tokens=96.0,
    update_flops=1e9,
    matmul_flops_per_s=2e10,
)


def round_trip(metrics: dict) -> TrainResult:
    sent = TrainResult("r", 3, 4, metrics, {"a": {"samples": 8.0, "tokens": 40.0}})
    back = result_from_pb(pb.TrainResponse.FromString(result_to_pb(sent, "p").SerializeToString()))
    assert back == sent
    return back


def test_a_result_carries_the_mean_staleness_and_the_timing():
    back = round_trip(METRICS)
    assert back.metrics["staleness_mean"] == 1.25 and back.metrics["update_flops"] == 1e9
    assert "rss_gb" not in back.metrics  # a trainer that did not measure its memory


def test_a_result_carries_the_trainers_memory():
    memory = dict(rss_gb=10.75, rss_released_gb=8.25, rss_peak_gb=11.0)
    assert round_trip(METRICS | memory).metrics["rss_peak_gb"] == 11.0


def test_a_result_carries_the_mismatch_figures():
    mismatch = dict(
        mismatch_kl=0.0125,
        mismatch_outside_support=0.25,
        mismatch_ratio_p05=0.75,
        mismatch_ratio_p50=1.0,
        mismatch_ratio_p95=1.5,
        mismatch_capped_fraction=0.125,
    )
    back = round_trip(METRICS | mismatch).metrics
    assert {k: back[k] for k in mismatch} == mismatch
    assert "mismatch_kl" not in round_trip(METRICS).metrics  # the correction off: none reported


def test_a_sample_keeps_its_policy_version():
    for version in (None, 0, 3):
        s = TrainSample("a", [1, 2], [3, 4], [-0.5, -1.0], 0.25, policy_version=version)
        assert sample_from_pb(pb.TrainSample.FromString(sample_to_pb(s).SerializeToString())) == s


def test_the_trainer_refuses_a_negative_staleness_or_cap():
    from trainer_svc.server import check_update  # the servicer's range checks, before it trains

    def check(**kw):
        check_update(update_from_pb(pb.UpdateParams(**kw)))

    check(max_staleness=4, behav_imp_cap=2.0)
    check()  # an old client
    check(behav_imp_cap=0.0)  # the correction off, on-policy
    with pytest.raises(
        InvalidArgument,
        match=r"behav_imp_cap -1.0 must be 0 \(the correction off\) or >= 1.*"
        r"max_staleness -1 must be >= 0",
    ):
        check(max_staleness=-1, behav_imp_cap=-1.0)
    with pytest.raises(InvalidArgument, match=r"behav_imp_cap 0.5 must be 0 .* or >= 1"):
        check(behav_imp_cap=0.5)
    # off with stale samples: the decoupled loss needs its cap; the message names both fixes
    with pytest.raises(
        InvalidArgument,
        match=r"behav_imp_cap 0 \(the correction off\) needs max_staleness 0, not 2.*"
        r"set behav_imp_cap to 1 or more \(2 is the default\) or max_staleness to 0",
    ):
        check(max_staleness=2, behav_imp_cap=0.0)

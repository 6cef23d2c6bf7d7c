"""The rollout/training mismatch math (atgrpo.algo.mismatch) and the loss's use of it, on small
tensors whose every expected number is worked out by hand beside it.

One update's five tokens: the trainer's and the engine's probabilities

    token      0     1     2      3     4
    trainer  0.5   0.25    0    0.4   0.1      (token 2: outside the trainer's top-k, -inf)
    engine   0.5   0.5   0.2    0.1   0.4

so the four tokens in support have ratios exp(trainer - engine) = 1, 0.5, 4, 0.25.
"""

from __future__ import annotations

import math

import pytest
import torch

from atgrpo.algo.loss import decoupled_policy_loss
from atgrpo.algo.mismatch import (
    in_support,
    mismatch_metrics,
    quantiles,
    truncated_weights,
)
from atgrpo.contract.trainer import MISMATCH_KEYS, LossConfig

INF = math.inf
TRAINER = torch.tensor([math.log(0.5), math.log(0.25), -INF, math.log(0.4), math.log(0.1)])
ENGINE = torch.tensor([math.log(0.5), math.log(0.5), math.log(0.2), math.log(0.1), math.log(0.4)])
OK = torch.tensor([True, True, False, True, True])


def test_support_is_where_both_log_probs_are_finite():
    assert in_support(TRAINER, ENGINE).tolist() == OK.tolist()
    assert in_support(torch.tensor([0.0, -INF]), torch.tensor([-INF, -INF])).tolist() == [
        False,
        False,
    ]


def test_weights_are_the_ratio_truncated_at_the_cap_and_zero_outside_the_support():
    trainer = TRAINER.clone().requires_grad_(True)
    w, capped = truncated_weights(trainer, ENGINE, OK, cap=2.0)
    # ratios 1, 0.5, -, 4, 0.25; the cap lowers 4 to 2; token 2 has none: weight 0
    assert w.tolist() == pytest.approx([1.0, 0.5, 0.0, 2.0, 0.25], rel=1e-6)
    assert capped.tolist() == [False, False, False, True, False]
    assert not w.requires_grad  # detached: the weight is a constant of the loss
    assert torch.isfinite(w).all()


def test_a_weight_at_the_cap_is_not_counted_as_truncated():
    # ratio exactly 2 with cap 2 (and float noise of 1e-7 on it) is kept whole, not "capped"
    w, capped = truncated_weights(
        torch.tensor([math.log(2.0) + 1e-7]), torch.tensor([0.0]), torch.tensor([True]), cap=2.0
    )
    assert w.item() == pytest.approx(2.0) and not capped.item()


def test_quantiles_interpolate_between_order_statistics():
    x = torch.tensor([4.0, 0.25, 1.0, 0.5])  # sorted: 0.25 0.5 1 4, positions q * 3
    # q 0.05: position 0.15 -> 0.25 + 0.15 * (0.5 - 0.25) = 0.2875
    # q 0.5: position 1.5 -> 0.5 + 0.5 * (1 - 0.5) = 0.75
    # q 0.95: position 2.85 -> 1 + 0.85 * (4 - 1) = 3.55
    assert quantiles(x, (0.05, 0.5, 0.95)) == pytest.approx([0.2875, 0.75, 3.55], rel=1e-12)
    assert quantiles(torch.tensor([]), (0.5,)) == [0.0]


def test_mismatch_figures_by_hand():
    m = mismatch_metrics(TRAINER, ENGINE, cap=2.0)  # float32 logs: figures to 1e-6
    assert tuple(m) == MISMATCH_KEYS
    # k3 per token, r - 1 - ln r: r=1: 0; r=0.5: -0.5 + 0.6931472 = 0.1931472;
    # r=4: 3 - 1.3862944 = 1.6137056; r=0.25: -0.75 + 1.3862944 = 0.6362944;
    # mean over the 4 in support: 2.4431472 / 4 = 0.6107868
    assert m["mismatch_kl"] == pytest.approx(0.6107868, rel=1e-6)
    assert m["mismatch_outside_support"] == 0.2  # 1 of 5 tokens
    assert (m["mismatch_ratio_p05"], m["mismatch_ratio_p50"], m["mismatch_ratio_p95"]) == (
        pytest.approx(0.2875, rel=1e-6),
        pytest.approx(0.75, rel=1e-6),
        pytest.approx(3.55, rel=1e-6),
    )
    assert m["mismatch_capped_fraction"] == 0.25  # 1 (ratio 4) of the 4 in support
    # a cap of 5 truncates none
    assert mismatch_metrics(TRAINER, ENGINE, cap=5.0)["mismatch_capped_fraction"] == 0.0


def test_no_token_in_support_gives_zeros_not_nan():
    m = mismatch_metrics(torch.tensor([-INF, -INF]), torch.tensor([-1.0, -2.0]), cap=2.0)
    assert m["mismatch_outside_support"] == 1.0
    assert all(math.isfinite(v) for v in m.values())
    assert m["mismatch_kl"] == m["mismatch_ratio_p50"] == m["mismatch_capped_fraction"] == 0.0


def test_identical_log_probs_have_no_mismatch():
    m = mismatch_metrics(ENGINE, ENGINE, cap=2.0)
    assert m["mismatch_kl"] == 0.0 and m["mismatch_capped_fraction"] == 0.0
    assert m["mismatch_ratio_p05"] == m["mismatch_ratio_p95"] == 1.0


def test_the_loss_weights_each_token_and_masks_the_one_outside_the_support():
    # The update's first pass: the new log-probs are the trainer's behaviour ones (ratio 1, no
    # clip), so each in-support token's loss is -A * w and its gradient -A * w / 4.
    new = TRAINER[None].clone().requires_grad_(True)  # (1, 5)
    adv = torch.tensor([1.0])
    loss, m = decoupled_policy_loss(
        new, TRAINER[None], ENGINE[None], adv, torch.ones(1, 5), LossConfig(behav_imp_cap=2.0)
    )
    # w = 1, 0.5, -, 2, 0.25: loss = -(1 + 0.5 + 2 + 0.25) / 4 = -0.9375
    assert loss.item() == pytest.approx(-0.9375, rel=1e-6)
    loss.backward()
    assert new.grad[0].tolist() == pytest.approx([-0.25, -0.125, 0.0, -0.5, -0.0625], rel=1e-6)
    assert m["masked_tokens"] == 1.0 and m["behav_capped_fraction"] == 0.25
    assert all(math.isfinite(v) for v in m.values())


def test_a_far_off_engine_log_prob_is_capped_not_infinite():
    # the engine says 1e-30 where the trainer says 0.5: ratio e^20 after the bound, weight 2
    far = torch.tensor([[-69.0776]])  # ln 1e-30
    new = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = decoupled_policy_loss(
        new, new.detach(), far, torch.tensor([-1.0]), torch.ones(1, 1), LossConfig()
    )
    assert loss.item() == pytest.approx(2.0, rel=1e-6)  # -A * w = 1 * 2
    loss.backward()
    assert new.grad.item() == pytest.approx(2.0, rel=1e-6) and m["behav_capped_fraction"] == 1.0

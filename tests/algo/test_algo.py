"""AT-GRPO math on values computed by hand, and the loss against TRL's own GRPO loss."""

import math

import pytest
import torch

from atgrpo.algo.advantages import group_advantages, group_index, mix_rewards, zero_variance_keep
from atgrpo.algo.loss import masked_mean, policy_loss
from atgrpo.contract.trainer import LossConfig
from tests.algo.trl_reference import trl_loss

EPS = 1e-6


def test_mix_rewards():
    team, local = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.2, -1.0, 0.0])
    assert mix_rewards(team, local, 1.0).tolist() == pytest.approx([1.2, -1.0, 0.5])
    assert mix_rewards(team, local, 0.5).tolist() == pytest.approx([0.7, -1.0, 0.25])


def test_groups_are_task_agent_turn_in_first_seen_order_and_never_pooled():
    keys = [
        ("t0", "tool", 0),
        ("t1", "tool", 0),
        ("t0", "tool", 0),
        ("t0", "plan", 0),
        ("t0", "tool", 1),
    ]
    assert group_index(keys).tolist() == [0, 1, 0, 2, 3]


def test_advantages_by_hand():
    # group 0: rewards 1, 2, 3 -> mean 2, unbiased std 1; group 1: 5, 5 (flat); group 2: 7
    # (singleton); group 3: 0, 4 interleaved with the others -> mean 2, unbiased std sqrt(8).
    rewards = torch.tensor([1.0, 5.0, 0.0, 2.0, 5.0, 7.0, 3.0, 4.0])
    groups = torch.tensor([0, 1, 3, 0, 1, 2, 0, 3])
    adv, flat = group_advantages(rewards, groups)
    s8 = math.sqrt(8)
    want = [-1 / (1 + EPS), 0, -2 / (s8 + EPS), 0, 0, 0, 1 / (1 + EPS), 2 / (s8 + EPS)]
    assert adv.tolist() == pytest.approx(want, rel=1e-6)
    assert flat.tolist() == [False, True, False, False, True, True, False, False]
    assert zero_variance_keep(flat).tolist() == [not f for f in flat.tolist()]


def test_dr_grpo_advantages_skip_the_std():
    adv, _ = group_advantages(
        torch.tensor([1.0, 2.0, 6.0]), torch.zeros(3, dtype=torch.long), norm_std=False
    )
    assert adv.tolist() == pytest.approx([-2.0, -1.0, 3.0])


def test_advantages_are_zero_mean_within_each_group():
    torch.manual_seed(0)
    groups = torch.randint(0, 7, (200,))
    adv, flat = group_advantages(torch.randn(200), groups)
    for g in groups.unique():
        assert adv[groups == g].mean().item() == pytest.approx(0.0, abs=1e-5)


def test_tiny_float_noise_is_not_a_signal():
    adv, flat = group_advantages(
        torch.tensor([0.1 + 0.2, 0.3], dtype=torch.double), torch.tensor([0, 0])
    )
    assert adv.tolist() == [0.0, 0.0] and flat.all()
    adv, flat = group_advantages(torch.tensor([0.3, 0.3 + 1e-6]), torch.tensor([0, 0]))
    assert not flat.any() and adv[1] > 0  # a real (if small) difference still counts


def test_policy_loss_by_hand():
    # One sample, two tokens (the second padding). ratio = e^0.5 = 1.6487 > 1.2: clipped for A = +1.
    lp, old = torch.tensor([[0.0, 9.0]]), torch.tensor([[-0.5, 0.0]])
    mask = torch.tensor([[1, 0]])
    loss, m = policy_loss(lp, old, torch.tensor([1.0]), mask, LossConfig())
    assert loss.item() == pytest.approx(-1.2)  # -A * clip(ratio) = -1.2
    assert m["clip_fraction"] == 1.0 and m["approx_kl"] == pytest.approx(0.125)
    # A = -1 with the same ratio: max(-A r, -A clip) = r = 1.6487 (below c=3: no dual clip).
    loss, m = policy_loss(lp, old, torch.tensor([-1.0]), mask, LossConfig())
    assert loss.item() == pytest.approx(math.exp(0.5), rel=1e-6)
    assert m["clip_fraction"] == 0.0  # outside the range, but the clip is not what counts


def test_dual_clip_bounds_negative_advantage_losses():
    # ratio e^2 = 7.39
    lp, old, mask = (
        torch.tensor([[2.0]]),
        torch.tensor([[0.0]]),
        torch.tensor([[1]]),
    )
    loss, _ = policy_loss(lp, old, torch.tensor([-0.5]), mask, LossConfig(dual_clip_c=3.0))
    assert loss.item() == pytest.approx(1.5)  # -c * A = 3 * 0.5, not 7.39 * 0.5
    loss, _ = policy_loss(lp, old, torch.tensor([0.5]), mask, LossConfig(dual_clip_c=3.0))
    assert loss.item() == pytest.approx(-0.6)  # positive A: the ordinary clip at 1.2


def test_token_mean_weighs_every_token_equally():
    lp = torch.zeros(2, 3)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, _ = policy_loss(lp, old, torch.tensor([4.0, 0.0]), mask, LossConfig())
    assert loss.item() == pytest.approx(-4.0 / 4)  # one token of 4 carries A=4; not (-4 + 0) / 2


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.3)])
def test_loss_equals_trls_grpo_loss(seed, eps_low, eps_high):
    torch.manual_seed(seed)
    B, T = 6, 9
    lp = torch.randn(B, T) * 0.4 - 1.0
    old = lp + torch.randn(B, T) * 0.4
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.25).long()
    mask[:, 0] = 1
    ours, _ = policy_loss(
        lp, old, adv, mask, LossConfig(eps_low, eps_high, dual_clip_c=float("inf"))
    )
    assert ours.item() == pytest.approx(
        trl_loss(lp, old, adv, mask, eps_low, eps_high).item(), abs=1e-6
    )


def test_kl_term_equals_trls():
    torch.manual_seed(1)
    lp, old, ref = (torch.randn(3, 4) * 0.3 - 1 for _ in range(3))
    adv, mask = torch.randn(3), torch.ones(3, 4, dtype=torch.long)
    ours, m = policy_loss(
        lp, old, adv, mask, LossConfig(kl_coef=0.05, dual_clip_c=float("inf")), ref_logprobs=ref
    )
    assert ours.item() == pytest.approx(
        trl_loss(lp, old, adv, mask, ref_logprobs=ref, beta=0.05).item(), abs=1e-6
    )
    assert m["kl_ref"] > 0


def test_entropy_bonus_lowers_the_loss_and_gradients_flow():
    lp = (torch.randn(2, 3) - 1).requires_grad_()
    ent = torch.full((2, 3), 0.7)
    mask = torch.ones(2, 3)
    base, _ = policy_loss(
        lp, lp.detach(), torch.tensor([1.0, -1.0]), mask, LossConfig(), entropy=ent
    )
    bonus, m = policy_loss(
        lp, lp.detach(), torch.tensor([1.0, -1.0]), mask, LossConfig(entropy_coef=0.1), entropy=ent
    )
    assert bonus.item() == pytest.approx(base.item() - 0.07) and m["entropy"] == pytest.approx(0.7)
    bonus.backward()
    assert lp.grad is not None and lp.grad.abs().sum() > 0
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0  # no tokens: no NaN

"""The decoupled PPO loss (asynchronous training, max_staleness > 0) on small cases worked out by
hand: ratio to the proximal policy, importance weight from the sampler to the proximal policy,
capped at behav_imp_cap. Every expected number is written literally, with the arithmetic beside
it."""

import math

import pytest
import torch

from atgrpo.algo.loss import decoupled_policy_loss, policy_loss
from atgrpo.contract.trainer import LossConfig

# ---- 2 sequences x 2 tokens, eps 0.2, dual clip c = 3, cap 2 ------------------------------------
# A = [1, -1]; prox = -1 everywhere.
# new = prox + [[0, ln 1.1], [ln 1.5, 0]]           -> r = [[1, 1.1], [1.5, 1]]
# behav = prox - [[0, ln 3], [-ln 2, ln 1.5]]       -> w = e^(prox - behav) = [[1, 3], [0.5, 1.5]]
#                                                      capped at 2: [[1, 2], [0.5, 1.5]]
# surrogate max(-A r, -A clip(r, 0.8, 1.2)), then for A < 0 min(., 3 * -A):
#   (0,0) A=1,  r=1:   -1           (0,1) A=1,  r=1.1: -1.1 (inside the range)
#   (1,0) A=-1, r=1.5: max(1.5, 1.2) = 1.5, below 3    (1,1) A=-1, r=1: 1
# weighted: -1*1, -1.1*2, 1.5*0.5, 1*1.5 = -1, -2.2, 0.75, 1.5; token-mean = -0.95 / 4 = -0.2375
A = torch.tensor([1.0, -1.0])
PROX = torch.full((2, 2), -1.0)
NEW = PROX + torch.tensor([[0.0, math.log(1.1)], [math.log(1.5), 0.0]])
BEHAV = PROX - torch.tensor([[0.0, math.log(3.0)], [-math.log(2.0), math.log(1.5)]])
CAP2 = LossConfig(behav_imp_cap=2.0)


def test_loss_gradient_and_metrics_by_hand():
    new = NEW.clone().requires_grad_()
    loss, m = decoupled_policy_loss(new, PROX, BEHAV, A, torch.ones(2, 2), CAP2)
    assert loss.item() == pytest.approx(-0.2375, rel=1e-6)
    assert m["loss"] == m["pg_loss"] == pytest.approx(-0.2375, rel=1e-6)
    # d loss / d new = w * (-A r) / 4 on every token (no clip is active):
    # [[1 * -1 / 4, 2 * -1.1 / 4], [0.5 * 1.5 / 4, 1.5 * 1 / 4]] = [[-0.25, -0.55], [0.1875, 0.375]]
    loss.backward()
    assert new.grad.flatten().tolist() == pytest.approx([-0.25, -0.55, 0.1875, 0.375], rel=1e-6)
    # approx_kl (to prox): 0.5 * (0 + ln(1.1)^2 + ln(1.5)^2 + 0) / 4
    #   = 0.5 * (0.0090840 + 0.1644020) / 4 = 0.0216857
    assert m["approx_kl"] == pytest.approx(0.0216857484, rel=1e-5)
    # behav_approx_kl: log w = [0, ln 3, -ln 2, ln 1.5]; 0.5 * (0 + 1.2069490 + 0.4804530 +
    # 0.1644020) / 4
    #   = 0.5 * 1.8518040 / 4 = 0.2314755
    assert m["behav_approx_kl"] == pytest.approx(0.2314755, rel=1e-5)
    # weights before the cap: mean (1 + 3 + 0.5 + 1.5) / 4 = 1.5, max 3; one token of 4 over the cap
    assert m["behav_imp_weight_mean"] == pytest.approx(1.5, rel=1e-6)
    assert m["behav_imp_weight_max"] == pytest.approx(3.0, rel=1e-6)
    assert m["behav_capped_fraction"] == 0.25
    assert m["clip_fraction"] == 0.0 and m["masked_tokens"] == 0.0


def test_the_cap_binds():
    # Without a binding cap token (0,1) weighs 3: the sum gains (3 - 2) * -1.1 = -1.1,
    # token-mean (-0.95 - 1.1) / 4 = -0.5125; nothing is capped.
    loss, m = decoupled_policy_loss(
        NEW, PROX, BEHAV, A, torch.ones(2, 2), LossConfig(behav_imp_cap=1e9)
    )
    assert loss.item() == pytest.approx(-0.5125, rel=1e-6) and m["behav_capped_fraction"] == 0.0
    # Cap 1: w = [[1, 1], [0.5, 1]]: (-1 - 1.1 + 0.75 + 1) / 4 = -0.0875; 2 tokens of 4 over the
    # cap.
    loss, m = decoupled_policy_loss(
        NEW, PROX, BEHAV, A, torch.ones(2, 2), LossConfig(behav_imp_cap=1.0)
    )
    assert loss.item() == pytest.approx(-0.0875, rel=1e-6) and m["behav_capped_fraction"] == 0.5


def test_the_clip_is_around_the_proximal_policy_not_the_sampler():
    # One token, A = 1: new = prox + ln 1.5 (r = 1.5 -> clipped at 1.2), behav = prox + ln 2 (w =
    # 0.5). Loss = w * -A clip(r) = 0.5 * -1.2 = -0.6, and no gradient. A ratio to the sampler would
    # be 1.5 / 2 = 0.75, which for A > 0 is not clipped (max(-0.75, -0.8) = -0.75) and would still
    # push.
    new = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, m = decoupled_policy_loss(
        new,
        torch.zeros(1, 1),
        torch.tensor([[math.log(2.0)]]),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        LossConfig(),
    )
    assert loss.item() == pytest.approx(-0.6, rel=1e-6) and m["clip_fraction"] == 1.0
    loss.backward()
    assert new.grad.item() == 0.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "cfg", [LossConfig(), LossConfig(0.1, 0.3, kl_coef=0.05, entropy_coef=0.01)]
)
def test_prox_equal_to_behav_is_exactly_policy_loss(seed, cfg):
    torch.manual_seed(seed)
    lp = torch.randn(4, 6) * 0.4 - 1.0
    old = lp + torch.randn(4, 6) * 0.5
    old[0, 2] = -math.inf  # the sampler's mask excludes it
    lp[1, 3] = -math.inf  # the trainer's mask excludes it
    adv, ref, ent = torch.randn(4), lp - 0.1, torch.rand(4, 6)
    mask = (torch.rand(4, 6) > 0.2).long()
    mask[:, :4] = 1
    a, b = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    want, wm = policy_loss(a, old, adv, mask, cfg, ref_logprobs=ref, entropy=ent)
    got, gm = decoupled_policy_loss(
        b, old, old.clone(), adv, mask, cfg, ref_logprobs=ref, entropy=ent
    )
    assert torch.equal(got, want)
    want.backward()
    got.backward()
    assert torch.equal(a.grad, b.grad)
    assert {k: gm[k] for k in wm} == wm
    assert gm["behav_imp_weight_mean"] == gm["behav_imp_weight_max"] == 1.0
    assert gm["behav_approx_kl"] == 0.0 and gm["behav_capped_fraction"] == 0.0


def test_gradients_flow_only_through_logprobs():
    new, prox, behav = (t.clone().requires_grad_() for t in (NEW, PROX, BEHAV))
    loss, _ = decoupled_policy_loss(new, prox, behav, A, torch.ones(2, 2), CAP2)
    loss.backward()
    assert new.grad is not None and new.grad.abs().sum() > 0
    assert prox.grad is None and behav.grad is None


def test_a_minus_inf_in_any_of_the_three_is_left_out_and_counted():
    # (0,1): behav -inf; (1,0): prox -inf; (1,1): new -inf. Only (0,0) is left: A=1, r=1, w=1 -> -1.
    new, prox, behav = NEW.clone(), PROX.clone(), BEHAV.clone()
    behav[0, 1], prox[1, 0] = -math.inf, -math.inf
    new[1, 1] = -math.inf
    new.requires_grad_()
    loss, m = decoupled_policy_loss(new, prox, behav, A, torch.ones(2, 2), CAP2)
    assert loss.item() == pytest.approx(-1.0) and m["masked_tokens"] == 3.0
    assert m["behav_imp_weight_max"] == 1.0 and m["behav_capped_fraction"] == 0.0
    loss.backward()
    assert torch.isfinite(new.grad).all() and new.grad.flatten().tolist() == pytest.approx(
        [-1.0, 0.0, 0.0, 0.0]
    )
    # Padding (mask 0) is neither in the loss nor counted as masked.
    loss, m = decoupled_policy_loss(NEW, PROX, BEHAV, A, torch.tensor([[1, 0], [0, 0]]), CAP2)
    assert loss.item() == pytest.approx(-1.0) and m["masked_tokens"] == 0.0


def test_every_token_masked_gives_zero_not_nan():
    loss, m = decoupled_policy_loss(NEW, PROX, BEHAV, A, torch.zeros(2, 2), CAP2)
    assert (
        loss.item() == 0.0
        and m["behav_imp_weight_max"] == 0.0
        and m["behav_imp_weight_mean"] == 0.0
    )

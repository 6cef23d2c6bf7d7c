"""The token draw (atgrpo.algo.sampling): the distribution it draws from, not only its log-probs."""

import math

import torch

from atgrpo.algo.sampling import inverse_cdf, sample_tokens
from atgrpo.contract.sampling import Sampling


def test_inverse_cdf_draws_each_token_at_its_probability():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.5]]).repeat(50_000, 1)
    picks = inverse_cdf(probs, torch.Generator().manual_seed(0))
    first = torch.bincount(picks[0::2], minlength=4) / 50_000
    second = torch.bincount(picks[1::2], minlength=4) / 50_000
    # 50,000 draws: the standard error of a share of 0.4 is 0.0022, so 0.01 is over 4 of them.
    assert torch.allclose(first, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.01)
    assert second[0] == 0 and second[2] == 0                     # probability 0: never drawn
    assert abs(second[1].item() - 0.5) < 0.01


def test_inverse_cdf_never_draws_a_zero_mass_edge_and_is_seeded():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]]).repeat(1000, 1)
    assert (inverse_cdf(probs, torch.Generator().manual_seed(1)) == 2).all()
    unnormalised = torch.rand(64, 1536, generator=torch.Generator().manual_seed(2))
    a = inverse_cdf(unnormalised, torch.Generator().manual_seed(3))
    b = inverse_cdf(unnormalised, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.max() < 1536


def test_sample_tokens_respects_top_k_and_reports_the_drawn_tokens_logprob():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    s = Sampling(max_tokens=1, temperature=0.7, top_k=2)
    tokens, logps = sample_tokens(logits, s, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}
    p0 = 1 / (1 + math.exp(-1 / 0.7))                            # softmax of (3, 2) at T = 0.7
    assert abs((tokens == 0).float().mean().item() - p0) < 0.03
    expected = torch.where(tokens == 0, math.log(p0), math.log(1 - p0))
    assert torch.allclose(logps, expected.float(), atol=1e-5)

"""The token draw (atgrpo.algo.sampling): the distribution it draws from, not only its log-probs."""

import math

import pytest
import torch

from atgrpo.algo.sampling import _one_level, inverse_cdf, sample_tokens, transform_logits
from atgrpo.contract.sampling import Sampling


def test_inverse_cdf_draws_each_token_at_its_probability():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.0, 0.5]]).repeat(50_000, 1)
    picks = inverse_cdf(probs, torch.Generator().manual_seed(0))
    first = torch.bincount(picks[0::2], minlength=4) / 50_000
    second = torch.bincount(picks[1::2], minlength=4) / 50_000
    # 50,000 draws: the standard error of a share of 0.4 is 0.0022, so 0.01 is over 4 of them.
    assert torch.allclose(first, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.01)
    assert second[0] == 0 and second[2] == 0  # probability 0: never drawn
    assert abs(second[1].item() - 0.5) < 0.01


def test_inverse_cdf_never_draws_a_zero_mass_edge_and_is_seeded():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0]]).repeat(1000, 1)
    assert (inverse_cdf(probs, torch.Generator().manual_seed(1)) == 2).all()
    unnormalised = torch.rand(64, 1536, generator=torch.Generator().manual_seed(2))
    a = inverse_cdf(unnormalised, torch.Generator().manual_seed(3))
    b = inverse_cdf(unnormalised, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.max() < 1536


@pytest.mark.parametrize("vocab, block", [(49_152, 256), (1_000, 256), (7, 256), (300, 16)])
def test_two_level_search_picks_the_token_one_prefix_sum_picks(vocab, block):
    # The same uniform per row (one draw each, the same generator), so the same token, whether the
    # vocabulary fills its blocks or not: peaked rows, flat rows, rows with zero-mass stretches.
    g = torch.Generator().manual_seed(4)
    logits = (
        torch.randn(256, vocab, generator=g) * torch.tensor([0.5, 3.0, 8.0]).repeat(86)[:256, None]
    )
    probs = torch.softmax(logits, -1)
    probs[::4, : vocab // 2] = 0.0  # a quarter of the rows with no mass in their first half
    two = inverse_cdf(probs, torch.Generator().manual_seed(5), block=block)
    one = _one_level(probs, torch.Generator().manual_seed(5))
    assert torch.equal(two, one)
    assert (probs.gather(-1, two[:, None]) > 0).all()


def test_two_level_search_draws_only_tokens_with_mass_beside_zeros_and_padding():
    # One token with all the mass in the middle of a block, zero-mass tokens around it (1e-300 is
    # 0 in float32), and a last block that is all padding (20 tokens in blocks of 8).
    probs = torch.zeros(2_000, 20)
    probs[:, 3] = 1e-300
    probs[:, 9] = 1.0
    picks = inverse_cdf(probs, torch.Generator().manual_seed(6), block=8)
    assert (picks == 9).all()


def test_sample_tokens_respects_top_k_and_reports_the_drawn_tokens_logprob():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    s = Sampling(max_tokens=1, temperature=0.7, top_k=2)
    tokens, logps = sample_tokens(logits, s, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}
    p0 = 1 / (1 + math.exp(-1 / 0.7))  # softmax of (3, 2) at T = 0.7
    assert abs((tokens == 0).float().mean().item() - p0) < 0.03
    expected = torch.where(tokens == 0, math.log(p0), math.log(1 - p0))
    assert torch.allclose(logps, expected.float(), atol=1e-5)


def sort_based_transform(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The transform as it was: the whole vocabulary sorted for top-p, the softmax taken twice."""
    out = logits / s.temperature
    if 0 < s.top_k < out.shape[-1]:
        kth = torch.topk(out, s.top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = torch.zeros_like(sorted_logits, dtype=torch.bool).scatter(
            -1, order, (probs.cumsum(-1) - probs) >= s.top_p
        )
        out = out.masked_fill(drop, float("-inf"))
    return out


@pytest.mark.parametrize(
    "top_k, top_p", [(20, 0.9), (20, 1.0), (0, 0.9), (5, 0.3), (50, 0.999), (0, 0.05)]
)
def test_the_transform_equals_the_sort_based_one_on_distinct_logits(top_k, top_p):
    logits = (
        torch.randn(64, 1000, generator=torch.Generator().manual_seed(top_k + int(100 * top_p))) * 3
    )
    s = Sampling(temperature=0.7, top_k=top_k, top_p=top_p)
    assert torch.equal(transform_logits(logits, s), sort_based_transform(logits, s))


def test_ties_with_the_last_kept_token_stay():
    # top-k 2 of [5, 4, 4, 4, 1]: the three tied 4s all stay.
    logits = torch.tensor([[5.0, 4.0, 4.0, 4.0, 1.0]])
    k2 = transform_logits(logits, Sampling(temperature=1.0, top_k=2))
    assert torch.isfinite(k2).tolist() == [[True, True, True, True, False]]
    # The survivors' mass counts all three 4s: the 5 holds e / (e + 3) = 0.475 of it. Top-p 0.4
    # keeps the 5 alone; top-p 0.48 needs a 4, and every 4 stays with it.
    p04 = transform_logits(logits, Sampling(temperature=1.0, top_k=2, top_p=0.4))
    assert torch.isfinite(p04).tolist() == [[True, False, False, False, False]]
    p048 = transform_logits(logits, Sampling(temperature=1.0, top_k=2, top_p=0.48))
    assert torch.isfinite(p048).tolist() == [[True, True, True, True, False]]

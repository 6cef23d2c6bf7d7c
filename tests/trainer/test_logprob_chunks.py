"""The chunked log-prob path (decoder to its last hidden state, then output layer, sampling
transform, log-softmax and gather a few positions at a time under checkpoint) against the
full-logits path it replaces: the same values and the same gradients, whatever the chunk size,
under temperature / top-k / top-p, on a full model and on LoRA adapters."""

import dataclasses

import pytest
import torch

from atgrpo.contract.sampling import Sampling
from tests.trainer.test_update import load, on_policy_samples
from tests.trainer.test_update_hardened import lora_model
from trainer_svc.update import chunked_head_available, response_logprobs

VOCAB = 1536   # the tiny model's
SAMPLINGS = (Sampling(temperature=0.7), Sampling(temperature=0.9, top_k=50, top_p=0.95),
             Sampling(temperature=1.3, top_p=0.8), Sampling(temperature=1.0, top_k=7))


def mixed_samples(model, n=7):
    """Rows of several sampling settings in one batch, and prompts and responses of several lengths."""
    return [dataclasses.replace(s, sampling=SAMPLINGS[i % len(SAMPLINGS)])
            for i, s in enumerate(on_policy_samples(model, n=n))]


def run(model, samples, **kw):
    model.zero_grad(set_to_none=True)
    lp, ent, mask = response_logprobs(model, samples, "cpu", **kw)
    # Weights that differ per token, so that a token scored at the wrong place changes the gradient.
    w = torch.linspace(0.5, 1.5, lp.numel()).reshape(lp.shape)
    (torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp)) * w).sum().add((ent * w.flip(0)).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), mask, grads


def assert_same(a, b):
    lp1, ent1, mask1, g1 = a
    lp2, ent2, mask2, g2 = b
    torch.testing.assert_close(mask1, mask2, rtol=0, atol=0)
    # -inf where the transform excludes the token, in both paths alike.
    assert torch.equal(torch.isfinite(lp1), torch.isfinite(lp2))
    assert (~torch.isfinite(lp1)).any() and torch.isfinite(lp1[mask1 > 0]).any()
    fin = torch.isfinite(lp1)
    # float32's own tolerance: the output layer's matmul over fewer rows rounds a little differently.
    torch.testing.assert_close(lp1[fin], lp2[fin])
    torch.testing.assert_close(ent1, ent2)
    assert g1.keys() == g2.keys() and g1
    for name in g1:
        # Gradients sum over every token: float32 rounding, relative to the tensor's largest entry.
        scale = g1[name].abs().max().item()
        torch.testing.assert_close(g1[name], g2[name], rtol=0, atol=2e-6 * scale, msg=name)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_the_chunked_path_equals_the_full_logits_path(tiny_model, kind):
    model = load(tiny_model) if kind == "full" else lora_model(tiny_model)
    assert chunked_head_available(model)
    samples = mixed_samples(model)
    full = run(model, samples, full_logits=True)
    for positions in (10**6, 16, 3, 1):        # one pass (no checkpoint), several, one position each
        assert_same(full, run(model, samples, chunk_elements=positions * VOCAB))


def test_entropy_as_a_metric_has_the_values_and_no_gradient(tiny_model):
    model = load(tiny_model)
    samples = mixed_samples(model, n=4)
    lp, ent, _ = response_logprobs(model, samples, "cpu", chunk_elements=2 * VOCAB)
    lp_m, ent_m, _ = response_logprobs(model, samples, "cpu", chunk_elements=2 * VOCAB, entropy_grad=False)
    assert ent.requires_grad and not ent_m.requires_grad and lp_m.requires_grad
    torch.testing.assert_close(ent_m, ent.detach(), rtol=0, atol=0)
    torch.testing.assert_close(lp_m, lp, rtol=0, atol=0)
    _, ent_none, _ = response_logprobs(model, samples, "cpu", with_entropy=False)
    assert not ent_none.any()


def test_without_gradients_the_chunks_need_no_checkpoint(tiny_model):
    model = load(tiny_model)
    samples = mixed_samples(model, n=3)
    with torch.no_grad():
        a = response_logprobs(model, samples, "cpu", full_logits=True)
        b = response_logprobs(model, samples, "cpu", chunk_elements=VOCAB)
    fin = torch.isfinite(a[0])
    torch.testing.assert_close(a[0][fin], b[0][fin])
    torch.testing.assert_close(a[1], b[1])

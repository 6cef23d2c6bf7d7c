"""The chunked log-prob path (decoder to its last hidden state, then output layer, sampling
transform, log-softmax and gather a few positions at a time under checkpoint) against the
full-logits path it replaces: the same values and the same gradients, whatever the chunk size,
under temperature / top-k / top-p, on a full model and on LoRA adapters."""

import dataclasses

import pytest
import torch

import trainer_svc.fused_head as fused_head
import trainer_svc.logprobs as logprobs
from atgrpo.algo.loss import policy_loss
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig
from tests.trainer.test_update import load, on_policy_samples
from tests.trainer.test_update_hardened import lora_model
from trainer_svc.logprobs import (
    chunked_head_available,
    hidden_logprobs,
    logits_logprobs,
    response_logprobs,
)

VOCAB = 1536  # the tiny model's
SAMPLINGS = (
    Sampling(temperature=0.7),
    Sampling(temperature=0.9, top_k=50, top_p=0.95),
    Sampling(temperature=1.3, top_p=0.8),
    Sampling(temperature=1.0, top_k=7),
)


def mixed_samples(model, n=7):
    """Rows of several sampling settings in one batch, and prompts and responses of several
    lengths."""
    return [
        dataclasses.replace(s, sampling=SAMPLINGS[i % len(SAMPLINGS)])
        for i, s in enumerate(on_policy_samples(model, n=n))
    ]


def run(model, samples, **kw):
    model.zero_grad(set_to_none=True)
    lp, ent, mask = response_logprobs(model, samples, "cpu", **kw)
    # Weights that differ per token, so that a token scored at the wrong place changes the gradient.
    w = torch.linspace(0.5, 1.5, lp.numel()).reshape(lp.shape)
    (torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp)) * w).sum().add(
        (ent * w.flip(0)).sum()
    ).backward()
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
    # float32's own tolerance: the output layer's matmul over fewer rows rounds a little
    # differently.
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
    # the fused backward on kept log-probs, and recomputing them
    for keep in (
        logprobs.LOGPROB_KEEP_ELEMENTS,
        0,
    ):
        logprobs.LOGPROB_KEEP_ELEMENTS = keep
        try:
            for positions in (10**6, 16, 3, 1):  # one pass, several, one position each
                assert_same(full, run(model, samples, chunk_elements=positions * VOCAB))
        finally:
            logprobs.LOGPROB_KEEP_ELEMENTS = 2**25


def test_entropy_as_a_metric_has_the_values_and_no_gradient(tiny_model):
    model = load(tiny_model)
    samples = mixed_samples(model, n=4)
    lp, ent, _ = response_logprobs(model, samples, "cpu", chunk_elements=2 * VOCAB)
    lp_m, ent_m, _ = response_logprobs(
        model, samples, "cpu", chunk_elements=2 * VOCAB, entropy_grad=False
    )
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


def _head_case(bias: bool):
    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(16, 97, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(97, 16, generator=g))
        if bias:
            head.bias.copy_(torch.randn(97, generator=g))
    hidden = torch.randn(3, 11, 16, generator=g)
    targets = torch.randint(0, 97, (3, 11), generator=g)
    mask = torch.ones(3, 11)
    mask[1, 7:] = 0
    return head, hidden, targets, mask


def _grads(head, hidden, targets, mask, samplings, path, entropy, accumulate, **kw):
    """Log-probs, entropies and gradients of a GRPO loss with an entropy bonus, over two
    micro-batches when `accumulate` (the head's .grad then holds the first one's)."""
    head.zero_grad(set_to_none=True)
    h = hidden.clone().requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0])
    cfg = LossConfig(entropy_coef=0.01 if entropy == "grad" else 0.0)
    for _ in range(2 if accumulate else 1):
        if path == "full":
            lp, ent = logits_logprobs(head(h), targets, mask, samplings, entropy=entropy)
        else:
            lp, ent = hidden_logprobs(head, h, targets, mask, samplings, entropy=entropy, **kw)
        old = torch.where(torch.isfinite(lp), lp.detach() - 0.1, lp.detach())
        loss, _ = policy_loss(
            torch.where(mask > 0, lp, torch.zeros_like(lp)), old, adv, mask, cfg, entropy=ent
        )
        loss.backward()
    return (
        lp.detach(),
        ent.detach(),
        h.grad,
        {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None},
    )


@pytest.mark.parametrize("entropy", ["grad", "metric"])
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_head_equals_autograd_with_an_entropy_bonus_and_targets_off_the_support(
    entropy, bias
):
    """The fused backward's d(logits) against autograd's through the transform: temperature,
    top-k and top-p, an entropy bonus (entropy_coef > 0) or entropy as a metric, targets outside
    the top-k support (-inf log-prob, no gradient and no NaN), a bias, and gradient accumulation
    into an existing .grad."""
    head, hidden, targets, mask = _head_case(bias)
    samplings = {
        Sampling(temperature=0.7, top_k=5): [0],
        Sampling(temperature=1.3, top_p=0.6): [1],
        Sampling(temperature=1.0): [2],
    }
    with torch.no_grad():  # row 0: every other target the least likely token, outside the top 5
        lowest = head(hidden[0]).argmin(-1)
        targets[0, ::2] = lowest[::2]
    for accumulate in (False, True):
        ref = _grads(head, hidden, targets, mask, samplings, "full", entropy, accumulate)
        assert (~torch.isfinite(ref[0][0, ::2])).all() and torch.isfinite(ref[0][2]).all()
        for chunk, keep in ((10**6, 10**9), (3 * 97, 0), (97, 10**9), (97, 0)):
            got = _grads(
                head,
                hidden,
                targets,
                mask,
                samplings,
                "fused",
                entropy,
                accumulate,
                chunk_elements=chunk,
                keep_elements=keep,
            )
            real = mask > 0  # the fused path scores real tokens only (0 elsewhere)
            assert torch.equal(torch.isfinite(got[0][real]), torch.isfinite(ref[0][real]))
            fin = torch.isfinite(ref[0]) & real
            torch.testing.assert_close(got[0][fin], ref[0][fin])
            torch.testing.assert_close(got[1][real], ref[1][real])
            assert torch.isfinite(got[2]).all()
            torch.testing.assert_close(got[2], ref[2], atol=1e-6, rtol=1e-5)
            assert got[3].keys() == ref[3].keys()
            for name in ref[3]:
                assert torch.isfinite(got[3][name]).all()
                torch.testing.assert_close(
                    got[3][name], ref[3][name], atol=1e-6, rtol=1e-5, msg=name
                )


def test_a_frozen_head_gets_no_gradient_and_the_hidden_rows_get_theirs():
    head, hidden, targets, mask = _head_case(False)
    head.weight.requires_grad_(False)
    samplings = {Sampling(temperature=0.9, top_k=20, top_p=0.9): [0, 1, 2]}
    ref = _grads(head, hidden, targets, mask, samplings, "full", "grad", False)
    got = _grads(
        head,
        hidden,
        targets,
        mask,
        samplings,
        "fused",
        "grad",
        False,
        chunk_elements=97,
        keep_elements=0,
    )
    assert head.weight.grad is None and got[3] == {} == ref[3]
    torch.testing.assert_close(got[2], ref[2], atol=1e-6, rtol=1e-5)


def test_under_bf16_autocast_the_fused_head_matches_autograd():
    """The output layer's matmul in bfloat16 (as head(hidden) under autocast), the rest float32."""
    head, hidden, targets, mask = _head_case(False)
    samplings = {Sampling(temperature=0.8, top_p=0.9): [0, 1, 2]}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(head, hidden, targets, mask, samplings, "full", "grad", False)
        got = _grads(
            head,
            hidden,
            targets,
            mask,
            samplings,
            "fused",
            "grad",
            False,
            chunk_elements=2 * 97,
            keep_elements=0,
        )
    assert got[3]["weight"].dtype == torch.float32
    fin = torch.isfinite(ref[0]) & (mask > 0)
    torch.testing.assert_close(got[0][fin], ref[0][fin])
    torch.testing.assert_close(got[2], ref[2], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got[3]["weight"], ref[3]["weight"], atol=1e-2, rtol=1e-2)


def test_a_gpus_passes_are_sized_by_its_memory(monkeypatch):
    from types import SimpleNamespace

    from trainer_svc.logprobs import pass_elements

    pass_elements.cache_clear()
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 2**30)
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    try:
        # 1/64 of 80 GiB in six float32 temporaries: 368 positions of Qwen3's vocabulary a pass
        assert pass_elements("cuda") == pass_elements("cuda:3") == 80 * 2**30 // 64 // 24
        assert pass_elements("cpu") == 2**24
    finally:
        pass_elements.cache_clear()


def test_the_head_backward_multiplies_a_column_major_copy_of_a_16_bit_weight_on_cpu():
    """Same values, the layout a CPU's fast 16-bit GEMM takes; float32 weights are left as they
    are."""
    from trainer_svc.fused_head import _column_major

    w = torch.randn(48, 8).bfloat16()
    got = _column_major(w)
    assert torch.equal(got, w) and got.stride() == (1, 48) and got.data_ptr() != w.data_ptr()
    f = torch.randn(48, 8)
    assert _column_major(f) is f


def test_without_an_entropy_gradient_the_head_backward_is_the_log_softmax_formula_bit_for_bit():
    """The fused backward's d(logits) when only the log-probs carry a gradient: onehot * g - p * g
    taken as -p * g plus g at the target (no (n, V) zeros, no row sum), the numbers of
    zeros.scatter_add(g) - p * its row sum exactly."""
    head, hidden, targets, mask = _head_case(False)
    sampling = Sampling(temperature=1.0, top_k=20)
    h = hidden[mask > 0].clone().requires_grad_()
    t = targets[mask > 0]
    g = torch.randn(len(t), generator=torch.Generator().manual_seed(3))
    lp, _ = fused_head._FusedHeadLogprobs.apply(
        h, head.weight, None, t, sampling, "metric", len(t), False
    )
    (lp * torch.where(torch.isfinite(lp), g, 0.0)).sum().backward()
    with torch.no_grad():
        logp = fused_head._pass_logp(h, head.weight, None, sampling)
        d = torch.zeros_like(logp).scatter_add_(
            -1, t[:, None], torch.where(torch.isfinite(lp), g, 0.0)[:, None]
        )
        dz = d.sub_(logp.exp().mul_(d.sum(-1, keepdim=True)))
    assert torch.equal(h.grad, dz @ head.weight)
    assert torch.equal(head.weight.grad, dz.T @ h.detach())

"""The update on the trainer's own behaviour log-probs (issue 59), with the real tiny model and real
optimizer steps: the same batch updated with the engine's true log-probs and with log-probs
perturbed on purpose. With the correction the PPO ratio sits on the trainer's log-probs, so the
perturbation reaches the update only through the truncated weight; without it (behav_imp_cap 0,
the old behaviour) the ratio itself is off and the update changes.

SGD throughout (as test_update_async): the parameters' change is the gradient itself, where
Adam's normalisation would blow float noise on near-zero gradients up into a visible difference.
"""

import dataclasses
import math

import pytest
import torch

from atgrpo.algo.mismatch import truncated_weights
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig
from tests.trainer.test_update import load, on_policy_samples, split
from trainer_svc.update import response_logprobs, update

LR = 0.1
OFF = LossConfig(behav_imp_cap=0.0)


def sgd_delta(tiny_model, samples, **cfg):
    """(metrics, the parameters' change, flat) of one update from the fresh tiny model."""
    model = load(tiny_model)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = update(
        model,
        torch.optim.SGD(params, lr=LR),
        samples,
        **split(grad_clip=1e9, **cfg),  # no clipping: the step is the gradient, linear in it
        params=params,
        generator=torch.Generator().manual_seed(1),
    )
    return metrics, torch.cat([p.detach().flatten() for p in model.parameters()]) - before


def perturbed(samples, shift_of):
    """The same tokens with each engine log-prob moved by shift_of(sample, token)."""
    return [
        dataclasses.replace(
            s, old_logprobs=[x + shift_of(i, t) for t, x in enumerate(s.old_logprobs)]
        )
        for i, s in enumerate(samples)
    ]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_with_the_correction_a_perturbed_engine_gives_the_true_update(tiny_model):
    # Cap 1 and an engine that finds every token less likely than the trainer (noise of up to
    # ~1.5 nats, every fourth token 10 nats off): each weight exp(trainer - engine) >= 1 is
    # truncated to exactly 1, so the cap takes out the whole perturbation and the update must be
    # the unperturbed one. Tolerance 1e-5 of the step: on the true log-probs the weights are
    # exp(+-1e-7) (the engine's log-probs here are the same model's, scored in another batch),
    # the only difference left, plus float summation order.
    true = on_policy_samples(load(tiny_model))
    g = torch.Generator().manual_seed(7)
    noise = {
        (i, t): abs(float(torch.randn(1, generator=g))) * 0.5 for i in range(8) for t in range(8)
    }
    off_samples = perturbed(true, lambda i, t: -10.0 if (i + t) % 4 == 0 else -noise[i, t])
    cap1 = LossConfig(behav_imp_cap=1.0)
    # two epochs of two mini-batches: the later steps' ratios are to the trust region's anchor
    steps = {"mini_batch_size": 4, "epochs": 2}
    m_true, d_true = sgd_delta(tiny_model, true, loss=cap1, **steps)
    m_corr, d_corr = sgd_delta(tiny_model, off_samples, loss=cap1, **steps)
    _, d_old_true = sgd_delta(tiny_model, true, loss=OFF, **steps)
    _, d_old = sgd_delta(tiny_model, off_samples, loss=OFF, **steps)

    assert m_corr["optimizer_steps"] == 4 and d_true.norm() > 0
    assert rel(d_corr, d_true) < 1e-5
    # On the true log-probs the correction changes nothing: the engine's are the trainer's.
    assert rel(d_old_true, d_true) < 1e-5
    # Without it the ratio starts at exp(trainer - engine) >= 1: tokens clip from the first step.
    assert rel(d_old, d_true) > 0.1
    # The figures say what happened: every token under-rated by the engine, none outside support.
    assert m_true["mismatch_kl"] == pytest.approx(0.0, abs=1e-9)
    assert m_corr["mismatch_ratio_p05"] >= 1.0 and m_corr["mismatch_outside_support"] == 0.0
    assert m_corr["mismatch_capped_fraction"] > 0.9  # all but tokens the noise left within 1e-5


def per_token_grads(model, samples):
    """Each response token's gradient of its log-prob, flat, in sample order: (tokens, params).
    By backward() into .grad, not autograd.grad: the chunked output layer writes its weight's
    gradient straight into .grad (trainer_svc.fused_head), which autograd.grad would miss."""
    params = list(model.parameters())
    lp = response_logprobs(model, samples, "cpu", with_entropy=False)[0]  # (B, T)
    rows = []
    for i, s in enumerate(samples):
        for t in range(len(s.response_ids)):
            model.zero_grad(set_to_none=True)
            lp[i, t].backward(retain_graph=True)
            rows.append(
                torch.cat(
                    [
                        (p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                        for p in params
                    ]
                )
            )
    model.zero_grad(set_to_none=True)
    return torch.stack(rows), lp.detach()


def test_the_default_cap_reweights_each_token_and_no_more(tiny_model):
    # Cap 2, noise both ways and tokens far off both ways, one optimizer step. The step starts at
    # ratio 1 to the trainer's log-probs (no clip), so its gradient is
    # -(1/N) sum_t w_t A_t grad lp_t: the true step with each token reweighted by the truncated
    # weight. Predicted from per-token gradients and truncated_weights, it must match to float
    # noise (1e-4 of the step: 36 tokens' gradients summed in another order), and it stays within
    # the triangle bound (LR/N) sum_t |w_t - 1| |A_t| |grad lp_t|: the cap's effect.
    model = load(tiny_model)
    true = on_policy_samples(model)
    g = torch.Generator().manual_seed(11)
    noise = {(i, t): float(torch.randn(1, generator=g)) * 0.2 for i in range(8) for t in range(8)}

    def shift(i, t):
        if (i + t) % 5 == 0:
            return -12.0  # the engine found it far less likely: weight capped at 2
        if (i + t) % 7 == 3:
            return -true[i].old_logprobs[t] - 1e-3  # engine log-prob ~0: weight ~0
        return noise[i, t]

    noisy = perturbed(true, shift)
    m_true, d_true = sgd_delta(tiny_model, true, mini_batch_size=8)
    m_corr, d_corr = sgd_delta(tiny_model, noisy, mini_batch_size=8)
    _, d_old = sgd_delta(tiny_model, noisy, mini_batch_size=8, loss=OFF)

    grads, trainer_lp = per_token_grads(model, true)  # (N, P), (B, T)
    trainer = torch.cat([trainer_lp[i, : len(s.response_ids)] for i, s in enumerate(true)])
    engine = torch.tensor([x for s in noisy for x in s.old_logprobs])
    adv = torch.tensor([s.advantage for s in true for _ in s.response_ids])
    w, capped = truncated_weights(trainer, engine, torch.ones_like(trainer, dtype=torch.bool), 2.0)
    n = len(trainer)
    predicted = LR / n * (w * adv) @ grads
    assert rel(d_true, LR / n * adv @ grads) < 1e-4  # the per-token gradients are the step's
    assert rel(d_corr, predicted) < 1e-4
    bound = LR / n * float(((w - 1).abs() * adv.abs() * grads.norm(dim=1)).sum())
    assert float((d_corr - d_true).norm()) <= bound * (1 + 1e-4)
    assert int(capped.sum()) >= 7  # the -12 nat tokens, and the noise over ln 2, if any
    assert m_corr["mismatch_capped_fraction"] == pytest.approx(int(capped.sum()) / n, abs=1e-9)
    # The old behaviour is another update: its ratio to the noisy log-probs clips tokens (their
    # gradient 0) and weighs the rest by the uncapped ratio.
    assert rel(d_old, d_corr) > 0.05
    assert all(math.isfinite(v) for v in m_corr.values())


def test_a_token_outside_the_trainers_support_is_masked_and_counted(tiny_model):
    # top_k 1: the trainer keeps only its argmax token, so a random response token is outside its
    # support (log-prob -inf) while the engine gave it a finite log-prob.
    model = load(tiny_model)
    samples = on_policy_samples(model)
    cut = [dataclasses.replace(samples[0], sampling=Sampling(temperature=0.7, top_k=1))]
    metrics, delta = sgd_delta(tiny_model, cut + samples[1:], mini_batch_size=8)
    n0 = len(samples[0].response_ids)
    tokens = sum(len(s.response_ids) for s in samples)
    assert metrics["masked_tokens"] >= n0 - 1  # at most one of its tokens is the argmax
    assert metrics["mismatch_outside_support"] == pytest.approx(
        metrics["masked_tokens"] / tokens, abs=1e-9
    )
    assert torch.isfinite(delta).all() and delta.norm() > 0
    assert all(math.isfinite(v) for v in metrics.values())


def test_the_first_steps_rows_take_their_log_probs_from_its_own_forward(tiny_model, monkeypatch):
    """Three mini-batches, two epochs: the proximal pass scores only the rows of the second and
    third steps (the first step's forwards run on the starting weights and give theirs), and the
    update is the one whose pass scores every row."""
    import trainer_svc.update as upd

    noisy = perturbed(on_policy_samples(load(tiny_model)), lambda i, t: 0.1 * ((i + t) % 3 - 1))
    steps = {"mini_batch_size": 3, "epochs": 2}
    m_skip, d_skip = sgd_delta(tiny_model, noisy, **steps)
    monkeypatch.setattr(upd, "first_step_rows", lambda plan: set())
    m_all, d_all = sgd_delta(tiny_model, noisy, **steps)
    assert rel(d_skip, d_all) < 1e-5
    for k in ("loss", "approx_kl", "behav_imp_weight_mean", "mismatch_kl", "mismatch_ratio_p95"):
        assert m_skip[k] == pytest.approx(m_all[k], rel=1e-5, abs=1e-9), k
    # the pass scored 5 of the 8 rows: fewer forward FLOPs, the same gradient ones
    assert m_skip["update_flops"] < m_all["update_flops"]
    assert m_skip["update_tokens"] == m_all["update_tokens"]

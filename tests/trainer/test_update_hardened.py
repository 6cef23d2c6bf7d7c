"""The update where it could go wrong at scale: ratios that overflow or are -inf, log-probs chunked
over the vocabulary, one agent's gradient scaling another's step, the KL to the reference, and
samples of the wrong weights."""

import contextlib
import dataclasses
import math

import pytest
import torch

from atgrpo.algo.loss import policy_loss
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig, TrainSample, UpdateConfig
from atgrpo.errors import FailedPrecondition
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.trainer import staleness_max
from trainer_svc.update import response_logprobs, update


@pytest.mark.parametrize("seed", range(40))
def test_any_log_probs_give_a_finite_loss_and_finite_gradients(seed):
    """Property: log-ratios up to +-200, -inf old or new log-probs, huge advantages."""
    g = torch.Generator().manual_seed(seed)
    b, t = 3, 7
    scale = float(torch.tensor([1.0, 30.0, 200.0])[seed % 3])
    new = (-torch.rand(b, t, generator=g) * scale).requires_grad_()
    old_values = -torch.rand(b, t, generator=g) * scale
    old_values[torch.rand(b, t, generator=g) < 0.2] = -math.inf
    new_inf = torch.rand(b, t, generator=g) < 0.1
    new_in = torch.where(new_inf, torch.full_like(new, -math.inf), new)
    mask = (torch.rand(b, t, generator=g) < 0.8).float()
    adv = torch.randn(b, generator=g) * 1e4
    ref = -torch.rand(b, t, generator=g) * scale
    loss, m = policy_loss(
        new_in,
        old_values,
        adv,
        mask,
        LossConfig(kl_coef=0.1, entropy_coef=0.01),
        ref_logprobs=ref,
        entropy=torch.rand(b, t, generator=g),
    )
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(new.grad).all()
    assert all(math.isfinite(v) for v in m.values())
    bad = (mask > 0) & (torch.isinf(old_values) | new_inf)
    assert m["masked_tokens"] == bad.sum().item()


def test_a_log_ratio_of_90_is_clamped_not_nan():
    new = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-90.0, -1.0]])
    for adv in (1.0, -1.0):
        loss, m = policy_loss(new, old, torch.tensor([adv]), torch.ones(1, 2), LossConfig())
        (grad,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(grad).all() and math.isfinite(m["approx_kl"])
        assert m["approx_kl"] == pytest.approx(0.5 * 20.0**2 / 2)  # the clamped ratio, token-mean


def test_chunking_the_log_probs_changes_no_value_and_no_gradient(tiny_model):
    model = load(tiny_model)
    samples = on_policy_samples(model, n=5)
    top_k = Sampling(temperature=0.9, top_k=50, top_p=0.95)
    samples = [
        dataclasses.replace(s, sampling=top_k) if i % 2 else s for i, s in enumerate(samples)
    ]
    results = []
    for chunk in (10**6, 3):
        model.zero_grad()
        # The full-logits path (FSDP's); the chunked one: test_logprob_chunks.py.
        lp, ent, mask = response_logprobs(
            model, samples, "cpu", full_logits=True, chunk_tokens=chunk
        )
        (lp.sum() + ent.sum()).backward()
        results.append(
            (lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        )
    (lp1, ent1, g1), (lp2, ent2, g2) = results
    torch.testing.assert_close(lp1, lp2, rtol=0, atol=0)
    torch.testing.assert_close(ent1, ent2, rtol=0, atol=0)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-6, atol=1e-7)


def lora_model(tiny_model):
    from peft import LoraConfig, get_peft_model

    model = load(tiny_model)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(model, cfg, adapter_name="coder")
    model.add_adapter("tester", cfg)
    return model


def train_lora(model, samples, **loss):
    def adapter(agent):
        model.base_model.set_adapter(agent)
        for name, p in model.named_parameters():
            p.requires_grad = "lora_" in name
        return torch.enable_grad()

    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    opt = torch.optim.AdamW(params, lr=1e-2)
    cfg = UpdateConfig(mini_batch_size=4, loss=LossConfig(**loss))  # grad_clip: 1.0
    return update(
        model,
        opt,
        samples,
        cfg,
        params=params,
        adapter=adapter,
        generator=torch.Generator().manual_seed(3),
        reference=lambda: base_of(model),
    )


@contextlib.contextmanager
def base_of(model):
    """A LoRA model's reference: its base, every adapter off (as PoolState.reference does)."""
    with model.disable_adapter():
        yield model


def b_adapter(model):
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if ".tester." in n and "lora_" in n
    }


def test_a_huge_gradient_on_agent_a_leaves_agent_bs_step_as_if_b_trained_alone(tiny_model):
    model = lora_model(tiny_model)
    samples = on_policy_samples(model, n=12, agents=("coder", "tester"))
    loud = [
        dataclasses.replace(s, advantage=s.advantage * 1e6) if s.agent == "coder" else s
        for s in samples
    ]
    together = lora_model(tiny_model)
    m = train_lora(together, loud)
    alone = lora_model(tiny_model)
    train_lora(alone, [s for s in samples if s.agent == "tester"])
    for name, value in b_adapter(alone).items():
        assert torch.equal(value, b_adapter(together)[name]), name
    assert m["grad_norm/coder"] > 1e3 * m["grad_norm/tester"]  # each adapter reports its own norm
    untrained = b_adapter(lora_model(tiny_model))
    assert any(not torch.equal(v, untrained[n]) for n, v in b_adapter(alone).items())  # b did move


def test_the_kl_term_pulls_towards_the_reference_and_reports_kl_ref(tiny_model):
    """LoRA: the reference is the base with the adapters off; kl_coef changes the step."""
    samples = on_policy_samples(lora_model(tiny_model), n=8, agents=("coder", "tester"))
    runs = {}
    for coef in (0.0, 10.0):
        model = lora_model(tiny_model)
        runs[coef] = (train_lora(model, samples, kl_coef=coef), b_adapter(model))
    assert "kl_ref" not in runs[0.0][0]
    assert runs[10.0][0]["kl_ref"] > 0  # init_lora_weights=False: the adapters differ from the base
    assert any(not torch.equal(runs[0.0][1][n], runs[10.0][1][n]) for n in runs[0.0][1])


def sample(version, agent="a"):
    return TrainSample(agent, [1, 2], [3], [-1.0], 1.0, policy_version=version)


def test_samples_of_other_weights_are_refused_naming_both_versions():
    assert staleness_max([sample(4), sample(4), sample(None)], allowed=4) == 0
    assert staleness_max([sample(None)], allowed=7) == 0
    with pytest.raises(
        FailedPrecondition,
        match=r"sample 1 \(agent 'b'\) was drawn from version 0.*only on version 5",
    ):
        staleness_max([sample(5), sample(0, "b")], allowed=5)


def test_an_async_pool_takes_samples_up_to_max_staleness_behind_and_no_newer():
    assert staleness_max([sample(5), sample(3), sample(None)], allowed=5, max_staleness=2) == 2
    assert staleness_max([sample(5)], allowed=5, max_staleness=2) == 0
    with pytest.raises(
        FailedPrecondition,
        match=r"sample 1 \(agent 'b'\) was drawn from version 2, 3 versions behind "
        r"version 5.*at most 2 behind \(max_staleness\).*raise max_staleness",
    ):
        staleness_max([sample(4), sample(2, "b")], allowed=5, max_staleness=2)
    with pytest.raises(
        FailedPrecondition,
        match=r"sample 0 \(agent 'a'\) was drawn from version 6, newer than version 5",
    ):
        staleness_max([sample(6)], allowed=5, max_staleness=2)
    # Synchronous: a newer sample gets today's message, as an older one does.
    with pytest.raises(
        FailedPrecondition, match=r"drawn from version 6, but this run trains only on version 5"
    ):
        staleness_max([sample(6)], allowed=5)

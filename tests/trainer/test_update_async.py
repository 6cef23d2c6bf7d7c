"""The update with max_staleness > 0 (asynchronous training): the proximal log-probs are the
weights the update starts from, scored per agent's adapter; on-policy samples give the synchronous
update, stale ones change it as the decoupled loss says."""

import dataclasses

import pytest
import torch

from atgrpo.contract.trainer import LossConfig, UpdateConfig
from tests.trainer.test_update import load, on_policy_samples, split
from tests.trainer.test_update_hardened import lora_model
from trainer_svc.update import (
    DECOUPLED_KEYS,
    TrainerUpdateSettings,
    UpdateContext,
    proximal_logprobs,
    response_logprobs,
    update,
)


def sgd_update(model, samples, **cfg):
    # SGD: the parameters' change is the gradient itself (Adam's normalisation would blow float
    # noise on near-zero gradients up into a visible difference).
    params = [p for p in model.parameters() if p.requires_grad]
    return update(
        model,
        torch.optim.SGD(params, lr=0.1),
        samples,
        **split(**cfg),
        params=params,
        generator=torch.Generator().manual_seed(1),
    )


# AReaL's cap, so that an importance weight of e^0.5 is not cut
CAP5 = LossConfig(behav_imp_cap=5.0)
# The correction off: the ratio on the sampler's log-probs, the synchronous update before issue 59
# (and still what behav_imp_cap 0 gives with max_staleness 0).
OFF = LossConfig(behav_imp_cap=0.0)


def stale(samples, shift):
    """The same tokens as if a sampler had found each `shift` nats less likely than these weights
    do."""
    return [
        dataclasses.replace(s, old_logprobs=[x - shift for x in s.old_logprobs]) for s in samples
    ]


def mixed_staleness(samples):
    """Seven samples (an odd count: one rank of two scores one more in the proximal pass), every
    other one as if from a sampler 0.5 nats less sure: the multi-rank test's input."""
    return [stale([s], 0.5)[0] if i % 2 else s for i, s in enumerate(samples[:7])]


def test_on_policy_samples_give_the_synchronous_update(tiny_model):
    # Two epochs of three mini-batches: after the first step the weights move away from the
    # proximal policy, which stays the starting weights, as the samples' own log-probs do.
    # On-policy with the default cap the update takes the same path as with max_staleness 2.
    runs = {}
    for name, staleness, loss in (("off", 0, OFF), ("on", 0, LossConfig()), ("stale", 2, None)):
        model = load(tiny_model)
        samples = on_policy_samples(model)
        runs[name] = (
            sgd_update(
                model,
                samples,
                mini_batch_size=3,
                epochs=2,
                micro_batch_tokens=20,
                max_staleness=staleness,
                **({"loss": loss} if loss else {}),
            ),
            model.state_dict(),
        )
    (sync, sync_w), (decoupled, dec_w) = runs["off"], runs["stale"]
    assert not set(DECOUPLED_KEYS) & set(sync)
    for k in sync_w:
        torch.testing.assert_close(dec_w[k], sync_w[k], rtol=1e-5, atol=1e-7, msg=k)
        torch.testing.assert_close(runs["on"][1][k], dec_w[k], rtol=0, atol=0, msg=k)
    for k in (
        "loss",
        "clip_fraction",
        "approx_kl",
        "entropy",
        "grad_norm",
        "masked_tokens",
        "optimizer_steps",
    ):
        assert decoupled[k] == pytest.approx(sync[k], rel=1e-4, abs=1e-7), k
    assert decoupled["behav_imp_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert decoupled["behav_approx_kl"] == pytest.approx(0.0, abs=1e-10)
    assert decoupled["behav_capped_fraction"] == 0.0


def test_stale_log_probs_change_the_update(tiny_model):
    # Every old log-prob 0.5 nats lower: the synchronous loss sees ratios e^0.5 = 1.65 to the
    # sampler and clips; the decoupled one sees ratio 1 to the proximal policy and weighs each token
    # by w = e^0.5 (under the cap of 5), so its one step is 1.65 x the on-policy step.
    model = load(tiny_model)
    fresh = on_policy_samples(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    results = {}
    for name, samples, staleness, loss in (
        ("fresh", fresh, 1, CAP5),
        ("stale", stale(fresh, 0.5), 1, CAP5),
        ("sync", stale(fresh, 0.5), 0, OFF),  # the ratio on the sampler's log-probs
    ):
        model.load_state_dict(before)
        metrics = sgd_update(
            model, samples, mini_batch_size=8, grad_clip=1e9, max_staleness=staleness, loss=loss
        )
        results[name] = (metrics, {k: v - before[k] for k, v in model.state_dict().items()})
    (m_stale, d_stale), (_, d_fresh), (m_sync, _) = (
        results["stale"],
        results["fresh"],
        results["sync"],
    )
    assert m_stale["behav_imp_weight_mean"] == pytest.approx(1.6487213, rel=1e-5)  # e^0.5
    assert m_stale["behav_approx_kl"] == pytest.approx(0.125, rel=1e-5)  # 0.5 * 0.5^2
    assert m_stale["approx_kl"] == pytest.approx(0.0, abs=1e-10) and m_stale["clip_fraction"] == 0.0
    assert m_sync["approx_kl"] == pytest.approx(0.125, rel=1e-5) and m_sync["clip_fraction"] > 0
    # Over all parameters at once: a bias whose exact gradient is 0 (k_proj's, softmax cancels it)
    # carries float noise that scales with nothing.
    got, want = (torch.cat([d[k].flatten() for k in sorted(d)]) for d in (d_stale, d_fresh))
    assert want.norm() > 0
    assert (got - 1.6487213 * want).norm() <= 1e-4 * got.norm()


def test_the_cap_bounds_a_very_stale_token(tiny_model):
    model = load(tiny_model)
    samples = stale(on_policy_samples(model), 3.0)  # w = e^3 = 20.1 > the cap of 5
    metrics = sgd_update(model, samples, mini_batch_size=8, max_staleness=4, loss=CAP5)
    assert metrics["behav_capped_fraction"] == 1.0
    assert metrics["behav_imp_weight_max"] == pytest.approx(20.085537, rel=1e-5)


def test_micro_batching_of_the_proximal_pass_changes_nothing(tiny_model):
    model = load(tiny_model)
    samples = on_policy_samples(model)
    whole, one_each = (
        proximal_logprobs(UpdateContext(model, samples, settings=TrainerUpdateSettings(tokens)))
        for tokens in (10_000, 1)
    )
    for s, a, b in zip(samples, whole, one_each, strict=True):
        assert a.shape == (len(s.response_ids),) and a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, torch.tensor(list(s.old_logprobs)), rtol=1e-5, atol=1e-6)
        assert not a.requires_grad


def test_a_lora_pool_scores_each_agent_with_its_own_adapter(tiny_model):
    # init_lora_weights=False: the two adapters differ, so an agent scored with the other's adapter
    # would show an importance weight far from 1.
    model = lora_model(tiny_model)
    samples = on_policy_samples(model, n=8, agents=("coder", "tester"))
    own = []
    for s in samples:
        model.base_model.set_adapter(s.agent)
        with torch.no_grad():
            lp = response_logprobs(model, [s], "cpu")[0][0]
        own.append(dataclasses.replace(s, old_logprobs=lp.tolist()))
    assert any(
        a.old_logprobs != b.old_logprobs
        for a, b in zip(samples, own, strict=True)
        if a.agent == "tester"
    )
    model = lora_model(tiny_model)
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name
    params = [p for n, p in model.named_parameters() if "lora_" in n]

    def adapter(agent):
        model.base_model.set_adapter(agent)
        # as a test adapter may: the proximal pass must stay gradient-free
        return torch.enable_grad()

    metrics = update(
        model,
        torch.optim.AdamW(params, lr=1e-2),
        own,
        UpdateConfig(mini_batch_size=2, max_staleness=1, loss=LossConfig()),
        params=params,
        adapter=adapter,
        generator=torch.Generator().manual_seed(3),
    )
    assert metrics["behav_imp_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["behav_approx_kl"] == pytest.approx(0.0, abs=1e-9)
    # Two steps per agent: the second one's ratio is to the weights before the first.
    assert metrics["optimizer_steps"] == 2 and metrics["approx_kl"] > 0


def test_samples_of_two_versions_train_together(tiny_model):
    model = load(tiny_model)
    samples = on_policy_samples(model)
    mixed = [
        dataclasses.replace(s, policy_version=3 if i % 2 else 2) for i, s in enumerate(samples)
    ]
    metrics = sgd_update(model, mixed, mini_batch_size=4, max_staleness=1)
    assert metrics["optimizer_steps"] == 2 and metrics["behav_imp_weight_mean"] == pytest.approx(
        1.0, abs=1e-5
    )


def test_a_one_step_update_takes_the_proximal_log_probs_from_its_own_forward(
    tiny_model, monkeypatch
):
    """One epoch, one mini-batch: every forward runs on the starting weights, so the extra scoring
    pass is skipped (a third less compute) and the update is the one with the pass."""
    import trainer_svc.update as upd

    runs = {}
    for shortcut in (True, False):
        monkeypatch.setattr(upd, "one_step", lambda *a, s=shortcut: s)
        model = load(tiny_model)
        samples = stale(on_policy_samples(model), 0.3)
        calls = []
        monkeypatch.setattr(
            upd,
            "proximal_logprobs",
            lambda *a, calls=calls, **k: calls.append(1) or proximal_logprobs(*a, **k),
        )
        runs[shortcut] = (
            sgd_update(model, samples, mini_batch_size=len(samples), max_staleness=1),
            model.state_dict(),
            len(calls),
        )
    (m_short, w_short, n_short), (m_pass, w_pass, n_pass) = runs[True], runs[False]
    assert (n_short, n_pass) == (0, 1)
    for k in w_pass:
        torch.testing.assert_close(w_short[k], w_pass[k], rtol=1e-5, atol=1e-7, msg=k)
    for k in ("loss", "behav_imp_weight_mean", "behav_approx_kl", "approx_kl"):
        assert m_short[k] == pytest.approx(m_pass[k], rel=1e-4, abs=1e-7), k


def test_which_updates_are_one_step():
    from trainer_svc.update import one_step

    samples = [type("S", (), {"agent": a})() for a in "aab"]
    assert one_step(samples, UpdateConfig(mini_batch_size=3), per_agent=False)
    assert not one_step(samples, UpdateConfig(mini_batch_size=2), per_agent=False)
    # each agent's 2 and 1
    assert one_step(samples, UpdateConfig(mini_batch_size=2), per_agent=True)
    assert not one_step(samples, UpdateConfig(mini_batch_size=3, epochs=2), per_agent=False)

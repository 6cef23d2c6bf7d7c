"""Prompt sharing in the update: rows with the same prompt (a group's K branches) run that prompt
through the decoder once and attend their responses to its keys and values. Equivalence against
the unshared path (log-probs, entropies and every parameter's gradient within float32 tolerance),
on a full model and on LoRA adapters, with groups interleaved and of several lengths; the work
it saves, counted in positions the decoder embeds; and the update's packing by prompt."""

import dataclasses

import pytest
import torch

import trainer_svc.logprobs as logprobs
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample, UpdateConfig
from tests.trainer.test_logprob_chunks import SAMPLINGS, assert_same, run
from tests.trainer.test_update import load
from tests.trainer.test_update_hardened import lora_model
from trainer_svc.packing import by_prompt, pack
from trainer_svc.update import update
from trainer_svc.update_context import TrainerUpdateSettings, shares_prompts


def grouped_samples(k=4, prompt_lens=(5, 9, 7), seed=0):
    """len(prompt_lens) groups of k rows each (one prompt, k responses of 2..6 tokens, mixed
    sampling settings), interleaved: row i is group i % groups."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 1500, (n,), generator=g).tolist() for n in prompt_lens]
    out = []
    for i in range(k * len(prompts)):
        response = torch.randint(3, 1500, (2 + i % 5,), generator=g).tolist()
        out.append(
            TrainSample(
                "a",
                prompts[i % len(prompts)],
                response,
                [0.0] * len(response),
                float(torch.randn(1, generator=g)),
                SAMPLINGS[i % len(SAMPLINGS)],
            )
        )
    return out


def embedded_positions(model, fn):
    """How many token positions the decoder embedded while `fn` ran, and its result."""
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _o: seen.append(args[0].numel())
    )
    try:
        result = fn()
        return sum(seen), result
    finally:
        hook.remove()


def test_shared_prompts_give_the_unshared_log_probs_and_gradients(tiny_model):
    model = load(tiny_model)
    samples = grouped_samples()
    assert shares_prompts(model)
    shared_work, shared = embedded_positions(model, lambda: run(model, samples))
    plain_work, plain = embedded_positions(model, lambda: run(model, samples, share_prompts=False))
    assert_same(shared, plain)
    # 3 prompts of at most 9 tokens once + 12 responses of at most 6 tokens, against 12 rows of 9 +
    # 6.
    assert (shared_work, plain_work) == (3 * 9 + 12 * 6, 12 * (9 + 6))


def test_lora_adapters_get_the_same_gradients_through_a_shared_prompt(tiny_model):
    model = lora_model(tiny_model)
    model.base_model.set_adapter("coder")
    for name, p in model.named_parameters():
        p.requires_grad = "lora_" in name
    samples = grouped_samples(k=3, prompt_lens=(4, 11), seed=1)
    shared, plain = run(model, samples), run(model, samples, share_prompts=False)
    assert_same(shared, plain)
    assert all("lora_" in n for n in shared[3])


def test_distinct_prompts_and_checkpointed_models_take_the_unshared_path(tiny_model, monkeypatch):
    model = load(tiny_model)
    calls = []
    real = logprobs._shared_prompt_hidden
    monkeypatch.setattr(logprobs, "_shared_prompt_hidden", lambda *a: calls.append(1) or real(*a))
    distinct = [
        dataclasses.replace(s, prompt_ids=[*s.prompt_ids, i])
        for i, s in enumerate(grouped_samples())
    ]
    run(model, distinct)
    assert calls == []
    run(model, grouped_samples())
    assert calls == [1]
    # Hugging Face's checkpointed layers drop the cache in training: no sharing there.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert not shares_prompts(model)
    run(model, grouped_samples())
    assert calls == [1]


def test_the_update_packs_a_mini_batch_by_prompt_and_counts_each_prompt_once():
    samples = grouped_samples(k=4, prompt_lens=(10, 20))  # rows alternate between the two prompts
    assert by_prompt(range(8), samples) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert [len(samples[r].response_ids) for r in (0, 2, 4, 6)] == [2, 4, 6, 3]
    t = 6
    # Shared, the group costs 10 + 4 x 6 = 34 tokens; unshared, rows x (10 + the longest response).
    assert pack([0, 2, 4, 6], samples, 10 + 4 * t, shared=True) == [[4, 2, 6, 0]]  # longest first
    assert pack([0, 2, 4, 6], samples, 10 + 4 * t) == [[4, 2], [6, 0]]  # 2 x 16 and 2 x 13
    # The second prompt does not fit beside the first: each group is a micro-batch of its own.
    assert sorted(
        map(sorted, pack(by_prompt(range(8), samples), samples, 20 + 4 * t, shared=True))
    ) == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize("budget", [4096, 40])
def test_an_update_with_shared_prompts_equals_the_unshared_one(tiny_model, budget, monkeypatch):
    """Two whole updates (several micro-batches at the small budget) from the same weights: the
    shared one's parameters equal the unshared one's."""

    def trained(share):
        model = load(tiny_model)
        # One plain sampling setting: every token in the support, so every micro-batching of
        # the mini-batch weighs the same tokens (a token outside a top-k counts in a micro-batch's
        # share but not in its loss).
        samples = [dataclasses.replace(s, sampling=Sampling()) for s in grouped_samples()]
        with torch.no_grad():
            lp = logprobs.response_logprobs(model, samples, "cpu", share_prompts=False)[0]
        samples = [
            dataclasses.replace(s, old_logprobs=lp[i, : len(s.response_ids)].tolist())
            for i, s in enumerate(samples)
        ]
        if not share:
            monkeypatch.setattr("trainer_svc.update.shares_prompts", lambda _m: False)
            monkeypatch.setattr(logprobs, "prefix_sharing_available", lambda _m: False)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1e-2)
        metrics = update(
            model,
            opt,
            samples,
            UpdateConfig(mini_batch_size=12),
            params=params,
            settings=TrainerUpdateSettings(micro_batch_tokens=budget),
            generator=torch.Generator().manual_seed(1),
        )
        return metrics, dict(model.named_parameters())

    m1, p1 = trained(True)
    monkeypatch.undo()
    m2, p2 = trained(False)
    assert m1["masked_tokens"] == m2["masked_tokens"] == 0  # tokens outside the support: none
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-5)
    for name in p1:
        torch.testing.assert_close(p1[name], p2[name], rtol=0, atol=1e-6, msg=name)

"""atgrpo.attention: on CPU, grouped-query attention with a padding mask runs without copying the
keys per query head, and computes what transformers' own sdpa computes (the tiny model is GQA:
4 query heads, 2 key/value heads)."""

import torch
from transformers import AutoModelForCausalLM

from atgrpo.attention import NAME, use_gqa_sdpa
from atgrpo.contract.sampling import Sampling
from rollout_svc.engines.hf import HFEngine


def _padded_batch(vocab: int):
    """Three prompts of 5, 9 and 13 tokens, left-padded: the batch needs a mask."""
    g = torch.Generator().manual_seed(0)
    lengths, width = (5, 9, 13), 13
    ids = torch.zeros((3, width), dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, width - n :] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _logits_and_grads(model, ids, mask, pos):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    (logits * mask[..., None]).square().sum().backward()  # padding's rows left out
    return logits.detach() * mask[..., None], {
        n: p.grad.clone() for n, p in model.named_parameters()
    }


def test_a_padded_batch_gives_the_same_logits_and_gradients_as_transformers_sdpa(tiny_model):
    stock = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    # GQA, or nothing is tested
    assert stock.config.num_key_value_heads < stock.config.num_attention_heads
    assert use_gqa_sdpa(ours) and ours.config._attn_implementation == NAME
    assert stock.config._attn_implementation == "sdpa"
    ids, mask, pos = _padded_batch(stock.config.vocab_size)
    want_logits, want_grads = _logits_and_grads(stock, ids, mask, pos)
    got_logits, got_grads = _logits_and_grads(ours, ids, mask, pos)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_other_attention_implementations_are_left_as_they_are(tiny_model):
    eager = AutoModelForCausalLM.from_pretrained(
        tiny_model, dtype=torch.float32, attn_implementation="eager"
    )
    assert use_gqa_sdpa(eager) is False
    assert eager.config._attn_implementation == "eager"


def test_the_hf_engine_decodes_padded_prompts_as_transformers_sdpa_does(tiny_model):
    engine = HFEngine(tiny_model, device="cpu", dtype="float32")
    assert engine.model.config._attn_implementation == NAME
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15] * 11]
    greedy = Sampling(temperature=0.0, max_tokens=12)
    ours = engine.generate(prompts, [2, 1, 2], greedy)
    engine.model.set_attn_implementation("sdpa")
    stock = engine.generate(prompts, [2, 1, 2], greedy)
    for mine, theirs in zip(
        (c for per in ours for c in per), (c for per in stock for c in per), strict=True
    ):
        assert mine.token_ids == theirs.token_ids
        torch.testing.assert_close(
            torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), rtol=0, atol=1e-5
        )


def test_a_bf16_engine_on_cpu_keeps_a_bf16_cache_and_decodes(tiny_model, monkeypatch):
    import rollout_svc.engines.hf_cache as hf_cache

    engine = HFEngine(tiny_model, device="cpu", dtype="bfloat16")
    made = []
    real = hf_cache.reserved_cache
    monkeypatch.setattr(hf_cache, "reserved_cache", lambda *a: made.append(real(*a)) or made[-1])
    out = engine.generate([[5, 6, 7], [8] * 9], [2, 2], Sampling(temperature=1.0, max_tokens=6))
    assert made and all(
        layer._k.dtype == torch.bfloat16 for cache in made for layer in cache.layers
    )
    completions = [c for per in out for c in per]
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in completions)
    assert all(torch.isfinite(torch.tensor(c.logprobs)).all() for c in completions)


def test_shared_prefix_attention_equals_attending_to_each_rows_prompt_and_own_keys():
    """Three prompts (left-padded to 7 positions) with 3, 1 and 2 rows, 3 own positions each, 6
    query heads over 2 key/value heads: the same as SDPA over each row's prompt keys (copied) and
    its own, concatenated, with the padding masked."""
    from atgrpo.attention import SharedPrefix, shared_prefix_attention
    from rollout_svc.engines.hf_shared import Rows

    g = torch.Generator().manual_seed(0)
    pk, pv = torch.randn(3, 2, 7, 8, generator=g), torch.randn(3, 2, 7, 8, generator=g)
    real = torch.ones(3, 7, dtype=torch.bool)
    real[0, :4], real[2, :1] = False, False
    rows = Rows(torch.tensor([0, 0, 0, 1, 2, 2]), real)
    assert rows.rank.tolist() == [0, 1, 2, 0, 0, 1] and rows.width == 3
    own_k, own_v = torch.randn(6, 2, 3, 8, generator=g), torch.randn(6, 2, 3, 8, generator=g)
    q = torch.randn(6, 6, 1, 8, generator=g)
    prefix = SharedPrefix(pk, pv, rows.real, rows.slot, rows.rank, rows.width, own_k)
    got = shared_prefix_attention(q, prefix, own_k, own_v, 0.3)
    keys = torch.cat([pk[rows.slot], own_k], dim=2)
    values = torch.cat([pv[rows.slot], own_v], dim=2)
    mask = torch.cat([real[rows.slot], torch.ones(6, 3, dtype=torch.bool)], dim=1)[:, None, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=0.3, enable_gqa=True
    )
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    # A prefix given no bias made for its step is masked by `real` as it is at the call.
    real[1, :2] = False
    again = shared_prefix_attention(q, prefix, own_k, own_v, 0.3)
    mask = torch.cat([real[rows.slot], torch.ones(6, 3, dtype=torch.bool)], dim=1)[:, None, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=0.3, enable_gqa=True
    )
    torch.testing.assert_close(again, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(again[3], got[3])  # row 3 is prompt 1's
    # Rows cut to 1 of prompt 0 and both of prompt 2: prompt 1 drops out, prompts renumbered.
    live = rows.select(torch.tensor([1, 4, 5]))
    assert live.tolist() == [0, 2] and rows.slot.tolist() == [0, 1, 1]
    assert rows.rank.tolist() == [0, 0, 1] and torch.equal(rows.real, real[[0, 2]])


def test_rows_in_prompt_order_attend_through_views_with_the_same_numbers():
    """Two prompts x 3 rows in prompt order (a fixed batch, none ended): the dense layout, a view
    of the rows, gives the scatter's numbers; rows cut or out of order are not dense."""
    from atgrpo.attention import SharedPrefix, dense_rows, shared_prefix_attention
    from rollout_svc.engines.hf_shared import Rows

    g = torch.Generator().manual_seed(1)
    pk, pv = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    real = torch.ones(2, 5, dtype=torch.bool)
    real[1, :2] = False
    rows = Rows(torch.tensor([0, 0, 0, 1, 1, 1]), real)
    assert rows.dense
    own_k, own_v = torch.randn(6, 2, 4, 8, generator=g), torch.randn(6, 2, 4, 8, generator=g)
    q = torch.randn(6, 4, 1, 8, generator=g)
    args = (pk, pv, rows.real, rows.slot, rows.rank, rows.width, own_k)
    dense = shared_prefix_attention(q, SharedPrefix(*args, dense=True), own_k, own_v, 0.3)
    scattered = shared_prefix_attention(q, SharedPrefix(*args), own_k, own_v, 0.3)
    assert torch.equal(dense, scattered)
    assert not dense_rows(torch.tensor([0, 1, 0, 1]), 2, 2)  # interleaved
    assert not dense_rows(torch.tensor([0, 0, 1]), 2, 2)  # prompt 1 has one row left
    assert not dense_rows(torch.tensor([], dtype=torch.long), 0, 0)
    rows.select(torch.tensor([0, 1, 3, 4, 5]))
    assert not rows.dense


def test_a_prefix_left_behind_by_a_failed_step_is_dropped_not_applied_to_the_next_call(
    tiny_model,
):
    from atgrpo.attention import SharedPrefix, attend_with_prefix, gqa_sdpa_forward

    module = AutoModelForCausalLM.from_pretrained(tiny_model).model.layers[0].self_attn
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h, n in ((4, 1), (2, 6), (2, 6)))
    want, _ = gqa_sdpa_forward(module, q, k, v, None, scaling=0.3)
    stale = torch.zeros(2, 2, 3, 8)  # the own keys of a step whose attention never ran
    ones = torch.ones(2, 3, dtype=torch.bool)
    rows = torch.tensor([0, 1])
    attend_with_prefix(SharedPrefix(stale, stale, ones, rows, rows * 0, 1, stale))
    got, _ = gqa_sdpa_forward(module, q, k, v, None, scaling=0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

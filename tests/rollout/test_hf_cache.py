"""The hf engine's reserved key/value cache (rollout_svc/engines/hf_cache.py) and its cut of
finished rows: the same greedy tokens and log-probs as Hugging Face's own DynamicCache decoding
every row to the end, and the layer's buffers behave as the concatenated cache would."""

import pytest
import torch
from transformers import AutoConfig

import rollout_svc.engines.hf as hf
import rollout_svc.engines.hf_cache as hf_cache
import rollout_svc.engines.hf_shared as hf_shared
from atgrpo.contract.sampling import Sampling
from rollout_svc.engines.hf import HFEngine
from rollout_svc.engines.hf_cache import ReservedLayer, reserved_cache


def kv(b, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g)


def test_a_reserved_layer_holds_what_concatenation_holds_and_grows_past_its_capacity():
    layer = ReservedLayer(capacity=6)
    parts = [kv(3, 5, 0), kv(3, 1, 1), kv(3, 1, 2)]  # a prefill of 5, then two steps: 7 > 6
    for k, v in parts:
        keys, values = layer.update(k, v)
    assert layer.get_seq_length() == 7 and layer._k.shape[-2] == 12  # doubled once
    torch.testing.assert_close(keys, torch.cat([k for k, _ in parts], dim=-2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v for _, v in parts], dim=-2), rtol=0, atol=0)
    layer.batch_select_indices(torch.tensor([2, 0]))
    torch.testing.assert_close(layer.keys, keys[[2, 0]], rtol=0, atol=0)
    k, v = kv(2, 1, 3)
    keys, _ = layer.update(k, v)
    assert keys.shape == (2, 2, 8, 4) and torch.equal(keys[:, :, -1:], k)
    layer.crop(-3)
    assert layer.get_seq_length() == 5 and layer.keys.shape[-2] == 5


def test_only_full_attention_models_get_a_reserved_cache(tiny_model):
    config = AutoConfig.from_pretrained(tiny_model)
    cache = reserved_cache(config, 64)
    assert cache is not None and len(cache.layers) == config.num_hidden_layers
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    assert reserved_cache(config, 64) is None


@pytest.mark.parametrize("stop_row", [0, 1])
def test_greedy_decoding_is_unchanged_by_the_reserved_cache_and_the_cut(
    tiny_model, monkeypatch, stop_row
):
    """Two prompts of different lengths, 4 samples each, greedy: a stop string taken from one
    prompt's output ends its 4 rows early, so the batch is cut to the other 4 (COMPACT_AT)."""
    engine = HFEngine(tiny_model, device="cpu", dtype="float32")
    prompts = [[5, 17, 300, 41, 9, 12, 88], [700, 3, 62]]
    plain = Sampling(temperature=0.0, max_tokens=12)
    first = engine.generate(prompts, [4, 4], plain)
    text = engine.tokenizer.decode(first[stop_row][0].token_ids[2:4])
    s = Sampling(temperature=0.0, max_tokens=12, stop=(text,))
    cuts = []
    real_select = hf_shared.SharedPrefixLayer.select
    monkeypatch.setattr(
        hf_shared.SharedPrefixLayer,
        "select",
        lambda self, idx, live: (
            cuts.append((len(idx), live.tolist())) or real_select(self, idx, live)
        ),
    )
    fast = engine.generate(prompts, [4, 4], s)
    # the cut: 4 of 8 rows went on (one call a layer), and the other prompt's keys were dropped
    assert (4, [1 - stop_row]) in cuts
    monkeypatch.setattr(hf, "COMPACT_AT", 0.0)
    monkeypatch.setattr(hf_cache, "reserved_cache", lambda *_a: None)
    slow = engine.generate(prompts, [4, 4], s)
    for f_rows, s_rows in zip(fast, slow, strict=True):
        for f, w in zip(f_rows, s_rows, strict=True):
            assert (f.token_ids, f.text, f.finish_reason) == (w.token_ids, w.text, w.finish_reason)
            torch.testing.assert_close(
                torch.tensor(f.logprobs), torch.tensor(w.logprobs), rtol=0, atol=1e-5
            )
    assert fast[stop_row][0].finish_reason == "stop" and len(fast[stop_row][0].token_ids) < 12


def test_prefill_groups_put_like_lengths_together_and_spare_unlike_ones_the_padding():
    assert hf.prefill_groups([5, 5, 5]) == [[0, 1, 2]]
    assert hf.prefill_groups([100, 300, 200]) == [[1], [2], [0]]  # longest first
    # 10, 10, 9 pad 30 positions for 29 real (within 10%); adding the 3 would pad 40 for 32
    assert hf.prefill_groups([3, 10, 9, 10]) == [[1, 3, 2], [0]]
    assert hf.prefill_groups([3, 10, 9, 10], waste=0.0) == [[1, 3], [2], [0]]


def test_grouped_prefill_decodes_as_one_padded_batch_does(tiny_model, monkeypatch):
    """Prompts of 10, 10, 9 and 3 tokens: a group of three (one of them padded within it) and one
    alone, placed into the batch's cache, against one padded batch and the model's own cache."""
    engine = HFEngine(tiny_model, device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (10, 3, 9, 10)]
    greedy = Sampling(temperature=0.0, max_tokens=10)
    grouped = engine.generate(prompts, [2, 1, 2, 1], greedy)
    monkeypatch.setattr(hf_cache, "reserved_cache", lambda *_a: None)
    batch = engine.generate(prompts, [2, 1, 2, 1], greedy)
    for mine, want in zip(
        (c for per in grouped for c in per), (c for per in batch for c in per), strict=True
    ):
        assert mine.token_ids == want.token_ids
        torch.testing.assert_close(
            torch.tensor(mine.logprobs), torch.tensor(want.logprobs), rtol=0, atol=1e-5
        )

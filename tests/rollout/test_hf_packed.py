"""The hf engine's linear layers on packed bf16 weights (rollout_svc/engines/hf_packed.py): the
same numbers as torch's linear bit for bit, and never a stale weight after an update."""

import pytest
import torch

from atgrpo.contract.sampling import Sampling
from rollout_svc.engines.hf import HFEngine
from rollout_svc.engines.hf_packed import can_pack, pack_linears

BF16 = torch.nn.Linear(1, 1).bfloat16()
needs_bf16 = pytest.mark.skipif(
    not can_pack(BF16), reason="this CPU's oneDNN runs no bf16: the engine packs nothing here"
)


def layer(seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(64, 96).bfloat16()


def x(rows: int = 5) -> torch.Tensor:
    return torch.randn(rows, 1, 64, generator=torch.Generator().manual_seed(1)).bfloat16()


def test_float32_weights_are_not_packed():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    assert pack_linears(model) == 0
    assert all(not hasattr(m, "_atgrpo_packed") for m in model)


@needs_bf16
def test_a_packed_layer_gives_torchs_numbers_and_follows_each_weight_update():
    lin = layer()
    assert pack_linears(lin) == 1 and pack_linears(lin) == 1  # twice: set up once
    with torch.inference_mode():
        assert torch.equal(lin(x()), torch.nn.functional.linear(x(), lin.weight, lin.bias))
        assert lin._atgrpo_packed is not None  # it did run packed
    with torch.no_grad():
        lin.weight.mul_(-2)  # written in place: the version counter moves
    with torch.inference_mode():
        assert torch.equal(lin(x()), torch.nn.functional.linear(x(), lin.weight, lin.bias))
    other = layer(seed=7)
    lin.load_state_dict(other.state_dict(), assign=True)  # replaced, as a full push adopts
    with torch.inference_mode():
        assert torch.equal(lin(x(3)), other(x(3)))


@needs_bf16
def test_with_gradients_on_a_packed_layer_runs_torchs_linear():
    lin = layer()
    pack_linears(lin)
    out = lin(x())
    assert out.requires_grad and lin._atgrpo_packed is None  # never packed: autograd's path
    out.float().sum().backward()
    assert lin.weight.grad is not None


@needs_bf16
def test_the_engine_samples_the_same_packed_after_a_full_push_and_with_an_adapter(tiny_model):
    packed = HFEngine(tiny_model, device="cpu", dtype="bfloat16")
    plain = HFEngine(tiny_model, device="cpu", dtype="bfloat16", pack_weights=False)
    assert any(hasattr(m, "_atgrpo_packed") for m in packed.model.modules())
    assert not any(hasattr(m, "_atgrpo_packed") for m in plain.model.modules())
    prompts, n = [[5, 6, 7, 8] * 5, [9, 10, 11]], [3, 2]
    s = Sampling(temperature=1.0, max_tokens=12, seed=4)

    def same() -> None:
        a, b = packed.generate(prompts, n, s), plain.generate(prompts, n, s)
        for per_a, per_b in zip(a, b, strict=True):
            for ca, cb in zip(per_a, per_b, strict=True):
                assert ca.token_ids == cb.token_ids and ca.logprobs == cb.logprobs

    same()
    g = torch.Generator().manual_seed(3)
    state = {
        k: (v + 0.05 * torch.randn(v.shape, generator=g).to(v.dtype)).contiguous()
        for k, v in plain.model.state_dict().items()
    }
    before = packed.generate(prompts, n, s)
    for engine in (packed, plain):
        engine.load_full({k: v.clone() for k, v in state.items()})
    same()  # the packed engine serves the pushed weights, not the ones it packed first
    assert [c.token_ids for per in before for c in per] != [
        c.token_ids for per in packed.generate(prompts, n, s) for c in per
    ]
    # a LoRA adapter wraps the packed layers: its requests run on them and the adapter's own
    from tests.rollout.test_rollout_service import _adapter

    state, cfg = _adapter(tiny_model, 1)
    for engine in (packed, plain):
        engine.load_adapter("tool", cfg, state)
    a, b = packed.generate(prompts, n, s, "tool"), plain.generate(prompts, n, s, "tool")
    assert [c.token_ids for per in a for c in per] == [c.token_ids for per in b for c in per]
    assert [c.logprobs for per in a for c in per] == [c.logprobs for per in b for c in per]

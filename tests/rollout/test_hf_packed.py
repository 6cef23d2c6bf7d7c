"""The hf engine's linear layers on packed weights (rollout_svc/engines/hf_packed.py): torch's
numbers (bit for bit in bf16, within float32 rounding in float32), and never a stale weight after
an update."""

import pytest
import torch

from atgrpo.contract.sampling import Sampling
from atgrpo.perf import packable
from rollout_svc.engines.hf import HFEngine
from rollout_svc.engines.hf_packed import pack_linears

DTYPES = [
    pytest.param(
        "float32",
        marks=pytest.mark.skipif(not packable(torch.float32), reason="no oneDNN in this torch"),
    ),
    pytest.param(
        "bfloat16",
        marks=pytest.mark.skipif(
            not packable(torch.bfloat16), reason="this CPU's oneDNN runs no bf16"
        ),
    ),
]


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    """bf16: the same bits (oneDNN runs torch's bf16 linear too); float32: oneDNN against MKL,
    rounding apart."""
    if a.dtype == torch.bfloat16:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def layer(dtype: str, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(64, 96).to(getattr(torch, dtype))


def x(dtype: str, rows: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 1, 64, generator=g).to(getattr(torch, dtype))


def test_float16_weights_are_not_packed():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)).half()
    assert pack_linears(model) == 0
    assert all(not hasattr(m, "_atgrpo_packed") for m in model)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_layer_gives_torchs_numbers_and_follows_each_weight_update(dtype):
    lin, inp = layer(dtype), x(dtype)
    assert pack_linears(lin) == 1 and pack_linears(lin) == 1  # twice: set up once
    with torch.inference_mode():
        same(lin(inp), torch.nn.functional.linear(inp, lin.weight, lin.bias))
        assert lin._atgrpo_packed is not None  # it did run packed
    with torch.no_grad():
        lin.weight.mul_(-2)  # written in place: the version counter moves
    with torch.inference_mode():
        same(lin(inp), torch.nn.functional.linear(inp, lin.weight, lin.bias))
    other = layer(dtype, seed=7)
    lin.load_state_dict(other.state_dict(), assign=True)  # replaced, as a full push adopts
    with torch.inference_mode():
        same(lin(inp), other(inp))


@pytest.mark.parametrize("dtype", DTYPES)
def test_with_gradients_on_a_packed_layer_runs_torchs_linear(dtype):
    lin = layer(dtype)
    pack_linears(lin)
    out = lin(x(dtype))
    assert out.requires_grad and lin._atgrpo_packed is None  # never packed: autograd's path
    out.float().sum().backward()
    assert lin.weight.grad is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_engine_samples_the_same_packed_after_a_full_push_and_with_an_adapter(
    tiny_model, dtype
):
    packed = HFEngine(tiny_model, device="cpu", dtype=dtype)
    plain = HFEngine(tiny_model, device="cpu", dtype=dtype, pack_weights=False)
    assert any(hasattr(m, "_atgrpo_packed") for m in packed.model.modules())
    assert not any(hasattr(m, "_atgrpo_packed") for m in plain.model.modules())
    prompts, n = [[5, 6, 7, 8] * 5, [9, 10, 11]], [3, 2]
    s = Sampling(temperature=1.0, max_tokens=12, seed=4)

    def agree(adapter: str = "") -> None:
        a, b = packed.generate(prompts, n, s, adapter), plain.generate(prompts, n, s, adapter)
        for ca, cb in zip([c for p in a for c in p], [c for p in b for c in p], strict=True):
            assert ca.token_ids == cb.token_ids
            same(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs))

    agree()
    g = torch.Generator().manual_seed(3)
    state = {
        k: (v + 0.05 * torch.randn(v.shape, generator=g).to(v.dtype)).contiguous()
        for k, v in plain.model.state_dict().items()
    }
    before = packed.generate(prompts, n, s)
    for engine in (packed, plain):
        engine.load_full({k: v.clone() for k, v in state.items()})
    agree()  # the packed engine serves the pushed weights, not the ones it packed first
    assert [c.token_ids for per in before for c in per] != [
        c.token_ids for per in packed.generate(prompts, n, s) for c in per
    ]
    # a LoRA adapter wraps the packed layers: its requests run on them and the adapter's own
    from tests.rollout.served import _adapter

    state, cfg = _adapter(tiny_model, 1)
    for engine in (packed, plain):
        engine.load_adapter("tool", cfg, state)
    agree("tool")


class QKV(torch.nn.Module):
    """Three sibling projections of one input, as an attention layer holds them."""

    def __init__(self, dtype: str, bias: bool):
        super().__init__()
        torch.manual_seed(2)
        for name, out in (("q_proj", 96), ("k_proj", 32), ("v_proj", 32)):
            setattr(self, name, torch.nn.Linear(64, out, bias=bias).to(getattr(torch, dtype)))

    def own(self, name: str, inp: torch.Tensor) -> torch.Tensor:
        lin = getattr(self, name)
        return torch.nn.functional.linear(inp, lin.weight, lin.bias)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sibling_projections_run_as_one_matmul_each_with_its_own_numbers(dtype, bias):
    m, inp = QKV(dtype, bias), x(dtype)
    pack_linears(m)
    assert m.q_proj._atgrpo_group[0] is m.v_proj._atgrpo_group[0]
    with torch.inference_mode():
        q, k, v = m.q_proj(inp), m.k_proj(inp), m.v_proj(inp)
        assert m.k_proj._atgrpo_packed is None  # k and v came from q's matmul
        for name, out in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            same(out, m.own(name, inp))
        assert m.q_proj._atgrpo_group[0].stash is None  # nothing held past the last sibling
        # another input, or the same one written in place since q's call: k's own matmul
        other = x(dtype, rows=3) * 3
        m.q_proj(inp)
        same(m.k_proj(other), m.own("k_proj", other))
    with torch.no_grad():  # outside inference mode the input keeps a version counter
        m.q_proj(inp)
        inp.mul_(-1)
        same(m.v_proj(inp), m.own("v_proj", inp))
        m.v_proj.weight.add_(1.0)  # one sibling's weight moved: the side-by-side copy follows
        m.q_proj(inp)
        same(m.v_proj(inp), m.own("v_proj", inp))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_with_fused_siblings_gives_the_same_logits(tiny_model, dtype):
    from transformers import AutoModelForCausalLM

    def model(fuse: bool):
        net = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=getattr(torch, dtype))
        pack_linears(net, fuse=fuse)
        return net.eval()

    fused, alone = model(True), model(False)
    groups = {id(m._atgrpo_group[0]) for m in fused.modules() if getattr(m, "_atgrpo_group", 0)}
    assert len(groups) == 2 * fused.config.num_hidden_layers  # q/k/v and gate/up, every layer
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    with torch.inference_mode():
        same(fused(input_ids=ids).logits, alone(input_ids=ids).logits)

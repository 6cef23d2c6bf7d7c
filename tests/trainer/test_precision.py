"""A pool's memory settings change no number they should not: gradient checkpointing gives the
update's loss and gradients exactly, and `dtype: bfloat16` (bf16 compute over float32 master
weights and AdamW state) moves the weights as float32 does, while what leaves the trainer
(pushes, the checkpoint's model folder) stays bfloat16."""

import json

import pytest
import torch
from safetensors.torch import load_file

from atgrpo.contract.trainer import PoolSpec, UpdateConfig
from tests.trainer.dist_worker import NO_CLIP
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.ops import PoolOps
from trainer_svc.state import PoolState


def spec(model_dir, **kw) -> PoolSpec:
    base = dict(
        run_id="r",
        pool="p",
        model_path=model_dir,
        agents=("a", "b"),
        seed=0,
        lr=1e-3,
        weight_decay=0.0,
        warmup_steps=0,
        total_steps=1000,
        min_lr_ratio=1.0,
        device="cpu",
        dtype="float32",
        grad_clip=NO_CLIP,
    )
    return PoolSpec(**{**base, **kw})


def setup(model_dir, **kw) -> PoolOps:
    ops = PoolOps()
    ops.setup(spec(model_dir, **kw))
    return ops


def train(ops: PoolOps, samples) -> dict[str, float]:
    # autocast and the clip are the pool's (PoolState.update_settings)
    return ops.train(samples, UpdateConfig(mini_batch_size=len(samples)))


def layer_calls(model) -> list[int]:
    """Counts the first decoder layer's forward calls (a checkpointed one runs again in the
    backward)."""
    layer = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
    calls, forward = [0], layer.forward

    def counted(*args, **kwargs):  # not a forward hook: the recompute does not fire those
        calls[0] += 1
        return forward(*args, **kwargs)

    layer.forward = counted
    return calls


@pytest.mark.parametrize("specialization", ["full", "lora"])
def test_checkpointing_gives_the_same_loss_and_gradients(tiny_model, specialization):
    samples = on_policy_samples(load(tiny_model), agents=("a", "b"))
    runs = {}
    for on in (False, True):
        ops = setup(tiny_model, specialization=specialization, gradient_checkpointing=on)
        assert ops.state.checkpointing is on
        calls = layer_calls(ops.state.model)
        metrics = train(ops, samples)
        # One forward per micro-batch (per agent on a LoRA pool), and with checkpointing a
        # recompute of each in the backward.
        assert calls[0] == (2 if specialization == "lora" else 1) * (2 if on else 1)
        runs[on] = (
            metrics,
            {
                n: p.grad.clone()
                for n, p in ops.state.model.named_parameters()
                if p.grad is not None
            },
        )
    (m_off, g_off), (m_on, g_on) = runs[False], runs[True]
    assert m_on["loss"] == pytest.approx(m_off["loss"], rel=1e-6, abs=1e-7)
    assert set(g_on) == set(g_off) and g_off
    assert any(float(g.abs().max()) > 0 for g in g_off.values())
    for name, g in g_off.items():
        torch.testing.assert_close(g_on[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_defaults_to_on_for_cuda_only(tiny_model):
    assert setup(tiny_model).state.checkpointing is False  # cpu: the recompute would only cost time
    from trainer_svc.loading import checkpointing_on

    assert checkpointing_on(spec(tiny_model, device="cuda"), "cuda:0") is True
    assert (
        checkpointing_on(spec(tiny_model, device="cuda", gradient_checkpointing=False), "cuda:0")
        is False
    )


def mean_relative_change(before: dict, after: dict) -> float:
    """sum |w10 - w0| / sum |w0| over every weight (float64, so the figure itself does not
    round)."""
    moved = sum(float((after[k].double() - before[k].double()).abs().sum()) for k in before)
    return moved / sum(float(before[k].double().abs().sum()) for k in before)


def ten_steps(model_dir, samples, **kw) -> tuple[float, PoolState]:
    ops = setup(model_dir, lr=5e-6, **kw)
    before = {n: p.detach().clone() for n, p in ops.state.model.named_parameters()}
    for _ in range(10):
        train(ops, samples)
    after = {n: p.detach() for n, p in ops.state.model.named_parameters()}
    return mean_relative_change(before, after), ops.state


def test_bf16_with_float32_masters_moves_the_weights_as_float32_does(tiny_model, tmp_path):
    samples = on_policy_samples(load(tiny_model))
    fp32, _ = ten_steps(tiny_model, samples, dtype="float32")
    bf16, state = ten_steps(tiny_model, samples, dtype="bfloat16")
    assert abs(bf16 / fp32 - 1) < 0.10, (bf16, fp32)
    assert state.mixed_bf16 and {p.dtype for p in state.params} == {torch.float32}
    assert {
        s.dtype for v in state.optimizer.state.values() for k, s in v.items() if k != "step"
    } == {torch.float32}

    # What bfloat16 weights stepped by AdamW directly did before (the path this replaces).
    model = load(tiny_model).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-6, weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    from trainer_svc.update import update
    from trainer_svc.update_context import TrainerUpdateSettings

    for _ in range(10):
        update(
            model,
            opt,
            samples,
            UpdateConfig(mini_batch_size=8),
            params=list(model.parameters()),
            settings=TrainerUpdateSettings(grad_clip=NO_CLIP),
        )
    assert (
        mean_relative_change(before, {n: p.detach() for n, p in model.named_parameters()})
        < 0.5 * fp32
    )

    # Pushes and the checkpoint's model folder stay bfloat16; the masters resume exactly.
    assert {v.dtype for v in state.full_state().values()} == {torch.bfloat16}
    state.save(tmp_path / "ckpt")
    saved = load_file(str(tmp_path / "ckpt" / "model" / "model.safetensors"))
    assert {v.dtype for v in saved.values()} == {torch.bfloat16}
    assert (
        json.loads((tmp_path / "ckpt" / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    )
    resumed = PoolState(spec(tiny_model, lr=5e-6, dtype="bfloat16"))
    resumed.load(tmp_path / "ckpt")
    for (name, p), q in zip(
        state.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert q.dtype == torch.float32 and torch.equal(p, q), name


def test_a_bf16_lora_pool_keeps_a_bf16_base_and_float32_adapters(tiny_model):
    samples = on_policy_samples(load(tiny_model), agents=("a", "b"))
    ops = setup(tiny_model, specialization="lora", dtype="bfloat16", lr=5e-6)
    before = {
        n: p.detach().clone() for n, p in ops.state.model.named_parameters() if p.requires_grad
    }
    train(ops, samples)
    dtypes = {n: p.dtype for n, p in ops.state.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    # frozen: no master needed
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    moved = [
        n
        for n, p in ops.state.model.named_parameters()
        if p.requires_grad and not torch.equal(p, before[n])
    ]
    assert moved  # lora_B starts at 0: it moves at lr 5e-6 in float32
    tensors, _ = ops.state.adapter_state("a")
    assert {v.dtype for v in tensors.values()} == {torch.float32}


def test_auto_is_bf16_in_full_on_a_bf16_gpu_and_float32_elsewhere(monkeypatch):
    from trainer_svc.loading import resolve_dtype

    assert (
        resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("float16", "cuda") == "float16"
    )
    # a pretend bf16-capable GPU: `auto` is bfloat16 itself, so a LoRA pool's frozen base is bf16
    # (it was float32 there, twice what `atgrpo plan` counts) and pushes leave in bf16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert (
        resolve_dtype("auto", "cuda:1") == "bfloat16" and resolve_dtype("auto", "cpu") == "float32"
    )


def test_an_auto_pool_on_the_cpu_holds_and_computes_in_float32(tiny_model):
    state = PoolState(
        PoolSpec("r", "p", tiny_model, ("a",), device="cpu", dtype="auto", specialization="lora")
    )
    assert state.spec.dtype == "float32" and not state.mixed_bf16
    assert {p.dtype for p in state.model.parameters()} == {torch.float32}


def test_the_fused_adamw_step_moves_the_weights_as_the_loop_does(tiny_model, tmp_path):
    """A pool's AdamW runs fused (state.fused_adamw): the same step as torch's per-weight loop up
    to float rounding, and a checkpoint written by a loop optimizer resumes into a fused one."""
    samples = on_policy_samples(load(tiny_model))
    ops = setup(tiny_model, lr=5e-3, weight_decay=0.01)
    assert ops.state.optimizer.param_groups[0]["fused"]
    loop = setup(tiny_model, lr=5e-3, weight_decay=0.01)
    state = loop.state
    state.optimizer = torch.optim.AdamW(state.params, lr=5e-3, weight_decay=0.01)
    state.scheduler = torch.optim.lr_scheduler.LambdaLR(state.optimizer, lambda s: 1.0)
    for _ in range(3):
        train(ops, samples)
        train(loop, samples)
    # Adam divides by the root of the second moment, so a weight whose gradients are near 0 carries
    # the kernels' different rounding order into its step: atol is 1/1000 of one step (lr).
    for (name, p), q in zip(
        ops.state.model.named_parameters(), state.model.parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=5e-6, msg=name)
    state.save(tmp_path / "ckpt")
    resumed = PoolState(spec(tiny_model, lr=5e-3, weight_decay=0.01))
    resumed.load(tmp_path / "ckpt")
    assert resumed.optimizer.param_groups[0]["fused"]
    exp_avg = {id(p): s["exp_avg"] for p, s in state.optimizer.state.items()}
    for p, q in zip(state.params, resumed.params, strict=True):
        torch.testing.assert_close(resumed.optimizer.state[q]["exp_avg"], exp_avg[id(p)])


def test_casting_each_norm_once_keeps_the_bf16_log_probs_and_gradients(tiny_model):
    """loading.cast_norms_once: under bf16 autocast the same log-probs, bit for bit, and the same
    gradients up to one more bf16 rounding of the projections' summed input gradients (autocast
    sums them in float32): as far from float32's as autocast's own (measured: 0.506% against
    0.503% of the gradient's norm, and 0.27% from autocast's)."""
    from trainer_svc.loading import cast_norms_once
    from trainer_svc.logprobs import response_logprobs

    samples = on_policy_samples(load(tiny_model))
    out = {}
    for mode in ("float32", "autocast", "once"):
        model = load(tiny_model)
        assert mode != "once" or len(cast_norms_once(model)) == 2 * model.config.num_hidden_layers
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "float32"):
            lp, _, mask = response_logprobs(model, samples, "cpu", with_entropy=False)
        (lp * mask).sum().backward()
        out[mode] = lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.equal(out["autocast"][0], out["once"][0])
    exact = out["float32"][1]

    def off(mode: str) -> float:
        return float(
            torch.linalg.vector_norm(out[mode][1] - exact) / torch.linalg.vector_norm(exact)
        )

    assert off("once") <= 1.1 * off("autocast") and off("autocast") < 0.02

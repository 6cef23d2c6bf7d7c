"""A bf16 update casts each float32 weight once per optimizer step (update._weight_casts_kept),
not once per micro-batch, and moves the weights exactly as casting per micro-batch did."""

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import trainer_svc.update as update_mod
from atgrpo.contract.trainer import UpdateConfig
from tests.trainer.dist_worker import NO_CLIP
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.update_context import TrainerUpdateSettings


class WeightCasts(TorchDispatchMode):
    """Counts the casts of `params` (by storage) to bf16."""

    def __init__(self, params):
        super().__init__()
        self.ptrs = {p.data_ptr() for p in params}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func is torch.ops.aten._to_copy.default
            and kwargs.get("dtype") == torch.bfloat16
            and args[0].data_ptr() in self.ptrs
        ):
            self.count += 1
        return func(*args, **kwargs)


def bf16_update(model_dir, samples, keep: bool, monkeypatch) -> tuple[dict, int]:
    if not keep:
        monkeypatch.setattr(update_mod, "_weight_casts_kept", lambda ctx: contextlib.nullcontext())
    model = load(model_dir)
    params = list(model.parameters())
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    counter = WeightCasts(linears)
    with counter:
        update_mod.update(
            model,
            torch.optim.SGD(params, lr=0.1),
            samples,
            UpdateConfig(mini_batch_size=len(samples)),
            params=params,
            # a budget that splits the step into several micro-batches
            settings=TrainerUpdateSettings(
                micro_batch_tokens=24, grad_clip=NO_CLIP, autocast_bf16=True
            ),
            generator=torch.Generator().manual_seed(1),
        )
    monkeypatch.undo()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, counter.count


def test_the_weights_are_cast_once_per_step_and_move_as_before(tiny_model, monkeypatch):
    samples = on_policy_samples(load(tiny_model))
    before, casts_before = bf16_update(tiny_model, samples, False, monkeypatch)
    now, casts_now = bf16_update(tiny_model, samples, True, monkeypatch)
    for name, w in before.items():
        assert torch.equal(now[name], w), name
    # the tied head is cast by the fused head itself (logprobs), once per pass, either way
    assert casts_now < casts_before / 2, (casts_now, casts_before)

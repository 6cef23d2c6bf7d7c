"""The hf engine's linear layers on CPU with their weights packed once for oneDNN (bf16, float32).

A decode step multiplies every weight by a few rows. torch's bf16 `linear` on CPU hands each call
to oneDNN with the weight in its plain layout, and oneDNN reorders it into its blocked one every
call: at decode sizes that reorder is a large share of the matmul. Packing each weight once
(`mkldnn._reorder_linear_weight`, what torch.compile's CPU freezing does) and calling oneDNN's
linear on the packed copy gives the same numbers bit for bit, faster (SmolLM2's 1536x576 at 32
rows: 171 against 141 us, at 1 row 68 against 37). torch's float32 `linear` runs MKL's sgemm,
which on this project's AMD EPYC reaches ~100 GFLOP/s a core where oneDNN reaches ~230: there
the packed layer gives the same numbers within float32 rounding (oneDNN sums in another order),
2.3x faster (tests/rollout/test_hf_packed.py, bench/real_speed.py).

The packed copy follows the weight: a layer whose weight was replaced (a full push adopts the
received tensors) or written in place (its version counter moved) packs again at its next call,
so a weight update can never be served stale. Where gradients are on, or the input is not the
weight's dtype, the layer runs torch's own linear.
"""

from __future__ import annotations

import types
import weakref

import torch

from atgrpo.perf import packable

# oneDNN's packed layout is chosen for a batch size; decode steps are a few dozen rows.
PACK_ROWS = 32


def can_pack(model: torch.nn.Module) -> bool:
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "cpu" and packable(param.dtype)


def pack_linears(model: torch.nn.Module) -> int:
    """Make every nn.Linear of `model` in its dtype run on a packed copy of its weight (when
    can_pack says so); how many layers will. Safe to call again: a layer already set up is left
    as it is."""
    if not can_pack(model):
        return 0
    dtype, count = next(model.parameters()).dtype, 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype == dtype:
            if not hasattr(module, "_atgrpo_packed"):
                module._atgrpo_packed = None  # (weakref to the weight, its version, packed)
                module.forward = types.MethodType(_packed_forward, module)
            count += 1
    return count


def _packed(module: torch.nn.Linear) -> torch.Tensor:
    weight, held = module.weight, module._atgrpo_packed
    if held is None or held[0]() is not weight or held[1] != weight._version:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
        module._atgrpo_packed = held = (weakref.ref(weight), weight._version, packed)
    return held[2]


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    # an inference tensor keeps no version counter, so an in-place update could not be seen
    if torch.is_grad_enabled() or x.dtype != weight.dtype or weight.is_inference():
        return torch.nn.functional.linear(x, weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, _packed(self), self.bias, "none", [], "")

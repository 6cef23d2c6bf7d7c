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

Sibling projections of one input (a layer's q/k/v, an MLP's gate/up) run as one matmul on their
weights packed side by side: the first one called computes all of them and hands the others their
columns when they are called with that very input (SmolLM2 at 32 rows: q/k/v 110 -> 93 us,
gate/up and down 432 -> 410; each column the same bits as its own layer gives).
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


# Sibling projections of one input, in the order the models call them (Llama, Qwen, Mistral...).
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def pack_linears(model: torch.nn.Module, fuse: bool = True) -> int:
    """Make every nn.Linear of `model` in its dtype run on a packed copy of its weight (when
    can_pack says so), SIBLINGS as one matmul where `fuse`; how many layers will. Safe to call
    again: a layer already set up is left as it is."""
    if not can_pack(model):
        return 0
    dtype, count = next(model.parameters()).dtype, 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.dtype == dtype:
            if not hasattr(module, "_atgrpo_packed"):
                module._atgrpo_packed = None  # ([(weakref to the weight, its version)], packed)
                module._atgrpo_group = None  # (its _Siblings, its place among them)
                module.forward = types.MethodType(_packed_forward, module)
            count += 1
    if fuse:
        for module in model.modules():
            for names in SIBLINGS:
                members = [getattr(module, n, None) for n in names]
                if _fusable(members, dtype):
                    group = _Siblings(members)
                    for i, m in enumerate(members):
                        m._atgrpo_group = (group, i)
    return count


def _fusable(members: list, dtype: torch.dtype) -> bool:
    return (
        all(hasattr(m, "_atgrpo_group") and m._atgrpo_group is None for m in members)
        and all(isinstance(m, torch.nn.Linear) and m.weight.dtype == dtype for m in members)
        and len({m.in_features for m in members}) == 1
        and len({m.bias is None for m in members}) == 1
    )


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _stale(held, weights: list[torch.Tensor]) -> bool:
    return held is None or any(
        ref() is not w or version != w._version
        for (ref, version), w in zip(held[0], weights, strict=True)
    )


def _packed(module: torch.nn.Linear) -> torch.Tensor:
    weight, held = module.weight, module._atgrpo_packed
    if _stale(held, [weight]):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
        module._atgrpo_packed = held = ([(weakref.ref(weight), weight._version)], packed)
    return held[1]


class _Siblings:
    """Linears of one input packed side by side. The first member's call computes every member's
    output and keeps the others' (`stash`) for their calls with that same input, unchanged since
    (its identity and version counter); a call with any other input runs the member alone."""

    def __init__(self, members: list[torch.nn.Linear]):
        self.members = members
        self.sizes = [m.out_features for m in members]
        self.held = None  # ([(weakref, version) per member weight], packed, bias)
        self.stash = None  # (weakref to the input, its version, the members' outputs)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        weights = [m.weight for m in self.members]
        if _stale(self.held, weights):
            packed = torch.ops.mkldnn._reorder_linear_weight(
                torch.cat([w.detach() for w in weights]), PACK_ROWS
            )
            biases = [m.bias for m in self.members]
            bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            self.held = ([(weakref.ref(w), w._version) for w in weights], packed, bias)
        outs = _linear(x, self.held[1], self.held[2]).split(self.sizes, dim=-1)
        self.stash = (weakref.ref(x), _version(x), outs)
        return outs[0]

    def take(self, x: torch.Tensor, i: int) -> torch.Tensor | None:
        stash = self.stash  # read once: another thread may replace it
        if stash is None or stash[0]() is not x or stash[1] != _version(x):
            return None
        if i == len(self.members) - 1:
            self.stash = None  # the last member's call: nothing is held past the layer
        return stash[2][i]


def _version(x: torch.Tensor) -> int | None:
    """An input's version counter. A tensor made in inference mode keeps none: there the stash
    goes by identity alone (no model writes a projection's input in place between its siblings'
    calls; one that did would need pack_linears(fuse=False))."""
    return None if x.is_inference() else x._version


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    # an inference tensor keeps no version counter, so an in-place update could not be seen
    if torch.is_grad_enabled() or x.dtype != weight.dtype or weight.is_inference():
        return torch.nn.functional.linear(x, weight, self.bias)
    if self._atgrpo_group is not None:
        group, i = self._atgrpo_group
        out = group.first(x) if i == 0 else group.take(x, i)
        if out is not None:
            return out
    return _linear(x, _packed(self), self.bias)

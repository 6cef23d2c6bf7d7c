"""The hf engine's key/value cache: Hugging Face's DynamicCache with its keys and values written in
place into buffers reserved for the whole generation.

DynamicLayer.update concatenates each step's key and value onto the cache, which copies every
cached position at every decode step: a third of the hf engine's decode time on CPU (measured:
torch.cat 34% of a SmolLM2 decode step at 32 rows and ~180 positions). Here the engine reserves
prompt + max_tokens positions at the prefill, and a step writes its one position. The keys and
values the attention reads are views of the buffers' first positions: the same numbers the
concatenated tensors held.

Only for models whose every layer is full attention (a sliding-window layer keeps a window, not
a prefix); `reserved_cache` says None for the others and the engine lets the model make its own.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, get_layer_types_and_kwargs


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in (B, H, capacity, D) buffers; it grows (doubling)
    past `capacity` rather than fail."""

    _layer_type = None  # never registered as a default layer type: only reserved_cache makes one

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k = self._v = None

    def lazy_initialization(
        self, key_states: torch.Tensor, value_states: torch.Tensor, batch: int | None = None
    ) -> None:
        self.dtype = key_states.dtype
        self.device = key_states.device
        b, h, n, _ = key_states.shape
        b, size = batch or b, max(self.capacity, n)
        # Zeros, not empty memory: positions a placed prefill leaves unwritten are masked, and a
        # masked NaN would still poison the attention's weighted sum (0 * NaN).
        self._k = key_states.new_zeros((b, h, size, key_states.shape[-1]), dtype=self.dtype)
        self._v = value_states.new_zeros(
            (b, value_states.shape[1], size, value_states.shape[-1]), dtype=self.dtype
        )
        self.is_initialized = True

    def place(
        self, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: int, end: int
    ) -> None:
        """Write one prefill group's keys and values (left-padded to the group's own width) into
        `rows` of a `batch`-row cache, ending at position `end` (the batch's prompt width)."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values, batch)
        if end > self._k.shape[-2]:
            self._grow(end)
        n = keys.shape[-2]
        self._k[rows, :, end - n : end] = keys.to(self.dtype)
        self._v[rows, :, end - n : end] = values.to(self.dtype)
        self.length = end
        self._views()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            self._grow(max(end, 2 * self._k.shape[-2]))
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def _grow(self, size: int) -> None:
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], size, old.shape[-1]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def crop(self, max_length: int) -> None:
        """Keep the first `max_length` positions (negative: drop that many from the end)."""
        if self.is_initialized:
            self.length = max(
                0, self.length + max_length if max_length < 0 else min(self.length, max_length)
            )
            self._views()

    def reset(self) -> None:
        self.length = 0
        self._k = self._v = None
        super().reset()


class ReservedCache(DynamicCache):
    """A DynamicCache (so the models treat it as one) of ReservedLayers."""

    def __init__(self, num_layers: int, capacity: int):
        Cache.__init__(self, layers=[ReservedLayer(capacity) for _ in range(num_layers)])

    def place(self, rows: torch.Tensor, part: Cache, batch: int, end: int) -> None:
        """Every layer of `part` (a prefill of some of the batch's prompts) into `rows`."""
        for layer, src in zip(self.layers, part.layers, strict=True):
            layer.place(rows, src.keys, src.values, batch, end)


def reserved_cache(config, capacity: int) -> ReservedCache | None:
    """A cache reserved for `capacity` positions for a model of `config`, or None where a layer is
    not full attention (sliding windows, chunked or linear attention, shared layers): the model's
    own cache then. The layer types are the ones DynamicCache(config=...) would give."""
    text = config.get_text_config(decoder=True)
    try:
        types, _ = get_layer_types_and_kwargs(text)
    except Exception:  # noqa: BLE001 - a config this version cannot read: the model's own cache
        return None
    if (
        not types
        or any(t != "full_attention" for t in types)
        or len(types) != text.num_hidden_layers
    ):
        return None
    return ReservedCache(len(types), capacity)

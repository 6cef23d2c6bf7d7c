"""The continuous batch's key/value cache (rollout_svc/engines/hf_batch.py): prompts in slots, held
once and shared by their samples (hf_shared.py's idea), and each decoding row's own keys.

Rows join and leave between decode steps, so unlike hf_shared.py's cache nothing is common to all
rows but the step: a row has its own number of generated keys (masked past it: `own_real`) and
its prompt has its own length (masked past it: `real`). Buffers are reserved with room to spare
(doubling when full), so a join writes only its own prompt and a leave moves only the rows that
fill its place: copying the whole cache at every join or leave would cost as much as a step.

Only where atgrpo.attention's own attention runs (the engine decides), as hf_shared.py.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from atgrpo.attention import SharedPrefix, StepBiases, attend_with_prefix, dense_rows


class Slots:
    """What every layer reads for a decode step: each row's prompt slot and its rank among that
    prompt's rows, which prompt positions are real, how many keys each row holds of its own."""

    def __init__(self, device: str):
        self.device = device
        self.prompt_len: list[int] = []  # per slot; 0: free
        self.step_rows = 0

    def take_slot(self, length: int) -> int:
        """The lowest free slot, for a prompt of `length` tokens (low slots keep a step's prompt
        attention short: it spans every slot up to the highest in use)."""
        for i, n in enumerate(self.prompt_len):
            if n == 0:
                self.prompt_len[i] = length
                return i
        self.prompt_len.append(length)
        return len(self.prompt_len) - 1

    def free_slot(self, slot: int) -> None:
        self.prompt_len[slot] = 0

    def prepare(self, slot: list[int], own_len: list[int]) -> None:
        """Set the step's views: `slot` and `own_len` (keys each row holds of its own before this
        step) per row; this step writes each row's key at its `own_len`."""
        dev = self.device
        self.step_rows = len(slot)
        self.slot = torch.tensor(slot, dtype=torch.long, device=dev)
        self.write = torch.tensor(own_len, dtype=torch.long, device=dev)
        self.own_width = max(own_len) + 1
        self.own_real = torch.arange(self.own_width, device=dev)[None, :] <= self.write[:, None]
        self.prompts = max(slot) + 1
        lengths = torch.tensor(self.prompt_len[: self.prompts], device=dev)
        self.prompt_width = int(lengths.max())
        self.real = torch.arange(self.prompt_width, device=dev)[None, :] < lengths[:, None]
        one_hot = torch.nn.functional.one_hot(self.slot, self.prompts)  # (N, P)
        self.rank = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
        self.width = int(self.rank.max()) + 1
        self.dense = dense_rows(self.slot, self.prompts, self.width)
        self.biases = StepBiases(self.real, self.own_real)


def _grown(buf: torch.Tensor, dim: int, need: int) -> torch.Tensor:
    """`buf` with at least `need` entries along `dim` (doubling), its content kept; zeros beyond:
    a masked NaN would still poison the attention's weighted sum (0 * NaN)."""
    if buf.shape[dim] >= need:
        return buf
    shape = list(buf.shape)
    shape[dim] = max(need, 2 * shape[dim])
    new = buf.new_zeros(shape)
    new.narrow(dim, 0, buf.shape[dim]).copy_(buf)
    return new


class SlotLayer(DynamicLayer):
    """One layer: prompts' keys (slots, H, D, width), transposed, and values (slots, H, width, D);
    rows' own keys and values (rows, H, T, D).

    A step reads the prompts' first `prompt_width` positions of a buffer reserved wider. Sliced
    that way, (.., width, D) keys made torch's bf16 batched matmul of the scores take a slow path
    on CPU: 8 prompts x 300 positions of SmolLM2's, 215 us against 62 for the same keys unsliced,
    while the transposed buffer's slice (.., D, :width) takes 86 (values, which are read as they
    lie, 79 against 57)."""

    _layer_type = None  # never a default layer type: only SlotCache makes one

    def __init__(self, slots: Slots):
        super().__init__()
        self.slots = slots
        self.pk = self.pv = self.ok = self.ov = None

    def _ensure(self, keys: torch.Tensor, slots: int, width: int, rows: int, own: int) -> None:
        if self.pk is None:
            h, d = keys.shape[1], keys.shape[-1]
            self.dtype, self.device = keys.dtype, keys.device
            self.pk = keys.new_zeros((slots, h, d, width))
            self.pv = keys.new_zeros((slots, h, width, d))
            self.ok = keys.new_zeros((rows, h, own, d))
            self.ov = keys.new_zeros((rows, h, own, d))
            self.is_initialized = True
            return
        self.pk = _grown(_grown(self.pk, 0, slots), 3, width)
        self.pv = _grown(_grown(self.pv, 0, slots), 2, width)
        self.ok, self.ov = (_grown(_grown(b, 0, rows), 2, own) for b in (self.ok, self.ov))

    def place(self, slot: int, keys: torch.Tensor, values: torch.Tensor, rows: int, own: int):
        """A prefilled prompt's keys and values (1, H, L, D) into `slot`, with room for `rows`
        decoding rows of up to `own` generated keys each."""
        n = keys.shape[-2]
        self._ensure(keys, slot + 1, n, rows, own)
        self.pk[slot, :, :, :n] = keys[0].transpose(-1, -2)
        self.pv[slot, :, :n] = values[0]

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Rows `src` take the places `dst` (rows that left)."""
        self.ok[dst] = self.ok[src]
        self.ov[dst] = self.ov[src]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.slots
        rows = torch.arange(s.step_rows, device=key_states.device)
        self.ok[rows, :, s.write] = key_states[:, :, 0].to(self.dtype)
        self.ov[rows, :, s.write] = value_states[:, :, 0].to(self.dtype)
        own_k = self.ok[: s.step_rows, :, : s.own_width]
        own_v = self.ov[: s.step_rows, :, : s.own_width]
        real_bias, own_bias = s.biases.get(self.dtype)
        attend_with_prefix(
            SharedPrefix(
                self.pk[: s.prompts, :, :, : s.prompt_width].transpose(-1, -2),
                self.pv[: s.prompts, :, : s.prompt_width],
                s.real,
                s.slot,
                s.rank,
                s.width,
                own_k,
                s.own_real,
                real_bias,
                own_bias,
                s.dense,
            )
        )
        self.keys, self.values = own_k, own_v
        return own_k, own_v

    def get_seq_length(self) -> int:
        s = self.slots
        return getattr(s, "prompt_width", 0) + getattr(s, "own_width", 1) - 1

    def reset(self) -> None:
        self.pk = self.pv = self.ok = self.ov = None
        super().reset()


class SlotCache(DynamicCache):
    """A DynamicCache (so the models treat it as one) of SlotLayers sharing one Slots."""

    def __init__(self, num_layers: int, device: str):
        self.slots = Slots(device)
        Cache.__init__(self, layers=[SlotLayer(self.slots) for _ in range(num_layers)])

    def place(self, slot: int, prefill: Cache, rows: int, own: int) -> None:
        for layer, src in zip(self.layers, prefill.layers, strict=True):
            layer.place(slot, src.keys, src.values, rows, own)

    def move(self, dst: list[int], src: list[int]) -> None:
        if dst:
            d = torch.tensor(dst, device=self.slots.device)
            s = torch.tensor(src, device=self.slots.device)
            for layer in self.layers:
                layer.move(d, s)

"""The hf engine's decode cache on CPU: each prompt's keys and values held once and shared by its
samples, beside each sample's own generated ones.

With K samples of a prompt, a cache copied K ways after the prefill made every decode step read
the prompt's keys and values K times: by arithmetic, SmolLM2 in float32 at 32 rows of ~200-token
prompts reads ~340 MB of cache a step, beside 540 MB of weights. Here a step reads each prompt's
once for all its rows (atgrpo.attention.shared_prefix_attention): a layer's update hands the
prompt part to the attention call that follows it, and returns the row's own keys, as a cache of
those alone would.

Only where that attention runs ("atgrpo_sdpa"; HFEngine decides): any other attention would see
the rows' own keys without their prompt.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from atgrpo.attention import SharedPrefix, StepBiases, attend_with_prefix, dense_rows
from rollout_svc.engines.hf_cache import ReservedLayer


class Rows:
    """Which prompt each row samples (`slot`), its place among that prompt's rows (`rank`), and
    which of each prompt's positions are real (left padding is not): one for all layers."""

    def __init__(self, slot: torch.Tensor, real: torch.Tensor):
        self.real = real
        self._set(slot)

    def _set(self, slot: torch.Tensor) -> None:
        self.slot = slot
        one_hot = torch.nn.functional.one_hot(slot, self.real.shape[0])  # (N, P)
        self.rank = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
        self.width = int(self.rank.max()) + 1 if slot.numel() else 0
        self.dense = dense_rows(slot, self.real.shape[0], self.width)
        self.biases = StepBiases(self.real)  # for every layer and step until the rows are cut

    def select(self, keep: torch.Tensor) -> torch.Tensor | None:
        """Keep rows `keep` (in that order); returns the prompts still sampled where some no
        longer are (their keys are dropped), else None."""
        slot = self.slot[keep]
        live = torch.unique(slot)  # sorted
        if live.numel() == self.real.shape[0]:
            self._set(slot)
            return None
        renumber = torch.full((self.real.shape[0],), -1, dtype=torch.long, device=slot.device)
        renumber[live] = torch.arange(live.numel(), device=slot.device)
        self.real = self.real[live]
        self._set(renumber[slot])
        return live


class SharedPrefixLayer(ReservedLayer):
    """One layer: the prompts' keys and values (P, H, W, D) and, as a ReservedLayer holds them,
    the rows' own (N, H, capacity, D)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int, rows: Rows):
        super().__init__(max(capacity, 1))
        self.prompt_keys, self.prompt_values, self.rows = keys, values, rows
        self.dtype, self.device = keys.dtype, keys.device
        n, h, d = rows.slot.shape[0], keys.shape[1], keys.shape[-1]
        self._k = keys.new_zeros((n, h, self.capacity, d))
        self._v = values.new_zeros((n, values.shape[1], self.capacity, values.shape[-1]))
        self.is_initialized = True
        self._views()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        own = super().update(key_states, value_states)
        r = self.rows
        attend_with_prefix(
            SharedPrefix(
                self.prompt_keys,
                self.prompt_values,
                r.real,
                r.slot,
                r.rank,
                r.width,
                self.keys,
                real_bias=r.biases.get(self.dtype)[0],
                dense=r.dense,
            )
        )
        return own

    def get_seq_length(self) -> int:
        return self.prompt_keys.shape[-2] + self.length

    def select(self, keep: torch.Tensor, live: torch.Tensor | None) -> None:
        self.batch_select_indices(keep)
        if live is not None:
            self.prompt_keys, self.prompt_values = self.prompt_keys[live], self.prompt_values[live]


class SharedPrefixCache(DynamicCache):
    """A DynamicCache (so the models treat it as one) of SharedPrefixLayers, made from a prefill's
    cache of the prompts (one row each, ending at the batch's prompt width): `slot` is each
    decode row's prompt, `real` (P, W) the prompts' real positions."""

    def __init__(self, prefill: Cache, slot: torch.Tensor, real: torch.Tensor, capacity: int):
        self.rows = Rows(slot, real.bool())
        Cache.__init__(
            self,
            layers=[
                SharedPrefixLayer(layer.keys, layer.values, capacity, self.rows)
                for layer in prefill.layers
            ],
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        live = self.rows.select(indices)
        for layer in self.layers:
            layer.select(indices, live)

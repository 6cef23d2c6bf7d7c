"""A decoder's sizes as its config.json gives them (ModelShape), and where that config is found:
the model's own folder, else the architecture-only copy the repository carries (atgrpo/models/
configs/), so a laptop plans a cluster run without the weights. What every memory figure starts
from (atgrpo.memory, atgrpo.memory_rollout); pure, nothing here imports torch or reads weights.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CARRIED_CONFIGS = Path(__file__).parent / "models" / "configs"
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """A Qwen/Llama-style decoder's sizes, as config.json gives them."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    source: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str = "") -> ModelShape:
        heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return cls(
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            source=source,
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear(self, name: str) -> tuple[int, int] | None:
        """(in, out) features of one decoder layer's linear `name`; None for another module."""
        h, a, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, a),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (a, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }.get(name)

    @property
    def layer_params(self) -> int:
        """Seven bias-free linears, two RMSNorms of h and Qwen3's q/k norms of head_dim."""
        linears = sum(i * o for i, o in map(self.linear, _LINEAR))
        return linears + 2 * self.hidden + 2 * self.head_dim

    @property
    def embedding_params(self) -> int:
        """The input embedding and the output layer (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> int:
        # + the final norm
        return self.layers * self.layer_params + self.embedding_params + self.hidden

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """One adapter: A (r x in) and B (out x r) on each targeted linear of every layer."""
        shapes = [s for s in map(self.linear, targets) if s is not None]
        return self.layers * sum(rank * (i + o) for i, o in shapes)

    def kv_bytes_per_token(self, width: int) -> int:
        """K and V of every layer: 2 * layers * kv_heads * head_dim * width."""
        return 2 * self.layers * self.kv_dim * width


def find_model_config(model_path: str) -> Path | None:
    """model_path/config.json, else the architecture-only copy the repository carries for a model of
    that folder's name (so a laptop plans a cluster run without the weights); None if neither."""
    own = Path(model_path).expanduser() / "config.json"
    if own.is_file():
        return own
    name = Path(model_path).name.lower()
    for carried in sorted(CARRIED_CONFIGS.glob("*/config.json")):
        if carried.parent.name.lower() == name:
            return carried
    return None


def load_shape(model_path: str) -> ModelShape | None:
    path = find_model_config(model_path)
    if path is None:
        return None
    return ModelShape.from_config(json.loads(path.read_text(encoding="utf-8")), source=str(path))

"""Tiny offline models: a Qwen2-style causal LM plus a locally trained byte-level BPE tokenizer."""

from atgrpo.models.tiny import SIZES, build_tiny_model, build_tokenizer, model_fingerprint

__all__ = ["SIZES", "build_tiny_model", "build_tokenizer", "model_fingerprint"]

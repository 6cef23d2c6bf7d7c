"""Build a tiny Qwen2-style causal LM and its tokenizer offline, reproducibly.

``build_tiny_model(out_dir, size, seed)`` trains a byte-level BPE tokenizer on the corpus shipped in
``atgrpo/models/corpus`` (plus text generated deterministically by ``_corpus``), initialises a
randomly weighted ``Qwen2ForCausalLM`` from one of :data:`SIZES` and saves both, so that two builds
with the same arguments give byte-identical directories (see :func:`model_fingerprint`). Nothing is
downloaded.

torch and transformers are imported lazily: importing this module needs only the standard library,
and :func:`train_tokenizer` needs only ``tokenizers``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from atgrpo.models import _corpus

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "IM_START_TOKEN",
    "PAD_TOKEN",
    "SIZES",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "build_tiny_model",
    "build_tokenizer",
    "model_fingerprint",
    "training_corpus",
    "train_tokenizer",
]

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
#: Like Qwen2, the model has no real BOS token; the config points bos_token_id at <|endoftext|>.
BOS_TOKEN = PAD_TOKEN
#: Special tokens, in id order (ids 0, 1, 2).
SPECIAL_TOKENS = (PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN)

#: Vocabulary size, special tokens included (a multiple of 64).
VOCAB_SIZE = 1536

#: ChatML, as Qwen uses it, without Qwen's default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Qwen2's pre-tokenizer split (digits one by one, words with their leading space). There is no
# normaliser (Qwen2 uses NFC), so every string round-trips through encode/decode exactly.
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_COMMON: dict[str, Any] = {
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "use_sliding_window": False,
}

#: Model sizes: name -> keyword arguments for ``transformers.Qwen2Config`` (vocab and special token
#: ids are added by :func:`build_tiny_model`).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        **_COMMON,
    },
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 768,
        **_COMMON,
    },
}


def training_corpus() -> list[str]:
    """The tokenizer's training text, with special tokens blanked so no merge goes to their
    pieces."""
    return _corpus.training_corpus(SPECIAL_TOKENS)


# ----------------------------------------------------------------------------------------------
# Tokenizer


def _empty_tokenizer() -> Any:
    """Qwen2's tokenizer pipeline around an empty byte-level BPE model."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    return tok


def _train_tokenizer_json(parallel: bool = False) -> str:
    from tokenizers import AddedToken, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tok = _empty_tokenizer()
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # BPE training is deterministic (merges break count ties by the pair itself; the unit tests
    # check it across processes, whose hash seeds differ, and with threads). Training on one
    # thread anyway removes any doubt and costs nothing at this corpus size.
    prev = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    try:
        tok.train_from_iterator(training_corpus(), trainer=trainer)
    finally:
        if prev is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = prev
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(
            f"tokenizer training gave {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}: "
            "the corpus is too small"
        )
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t} got id {tok.token_to_id(t)}, expected {i}")
    return tok.to_str()


@functools.lru_cache(maxsize=1)
def _trained_tokenizer_json() -> str:
    return _train_tokenizer_json(parallel=False)


def train_tokenizer() -> Any:
    """Train (once per process) and return the byte-level BPE ``tokenizers.Tokenizer``.

    Its pipeline is Qwen2's (NFC normaliser, Qwen2's split regex, byte-level pre-tokenizer and
    decoder), so text round-trips through encode/decode up to NFC normalisation.
    """
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_trained_tokenizer_json())


def build_tokenizer() -> Any:
    """The trained tokenizer as a ``transformers`` ``Qwen2Tokenizer`` with the ChatML template.

    transformers 5 loads any ``model_type: qwen2`` directory's tokenizer as ``Qwen2Tokenizer``,
    which rebuilds Qwen2's pipeline around the saved vocab and merges; building with that class
    and that pipeline makes the tokenizer that ``AutoTokenizer`` (and vLLM) loads identical to the
    one saved, whichever way it is loaded.
    """
    from transformers import Qwen2Tokenizer

    model = json.loads(_trained_tokenizer_json())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return Qwen2Tokenizer(
        vocab=dict(model["vocab"]),
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[IM_START_TOKEN],
        post_processor=_empty_tokenizer().post_processor,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=SIZES["tiny"]["max_position_embeddings"],
    )


# ----------------------------------------------------------------------------------------------
# Model


def build_tiny_model(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Build the ``size`` model with weights drawn from ``seed`` and its tokenizer into ``out_dir``.

    Writes config.json, generation_config.json, model.safetensors (float32, tied embeddings) and
    the tokenizer files. The same (size, seed) always gives the same bytes. Files already in
    ``out_dir`` that the build does not write are left alone. Returns ``out_dir`` as a Path.
    """
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        max_window_layers=SIZES[size]["num_hidden_layers"],
        **SIZES[size],
    )
    config.dtype = torch.float32
    # Seed a private copy of the global RNG state, so building does not disturb the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return save_model(model, tokenizer, out)


def save_model(model: Any, tokenizer: Any, out: Path) -> Path:
    """`model` as safetensors and `tokenizer` into `out` (made), quietly; returns `out`."""
    from transformers.utils import logging as hf_logging

    out.mkdir(parents=True, exist_ok=True)
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" would go to the CLI's stderr
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    # safetensors writes its file 0600; give it the mode the other files got from the umask.
    os.chmod(out / "model.safetensors", (out / "config.json").stat().st_mode & 0o777)
    return out


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over every regular file under ``model_dir``: sorted relative paths and their bytes."""
    root = Path(model_dir)
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for p in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        name = p.relative_to(root).as_posix().encode("utf-8")
        data = p.read_bytes()
        h.update(len(name).to_bytes(8, "big") + name)
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()

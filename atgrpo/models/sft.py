"""Supervised fine-tuning on demonstrations (atgrpo.sdk.demos): the warm start that gives a
model which never answers in its env's format a first reward to improve on.

Each demonstration is the prompt the rollout would render for its agent (atgrpo.models.chat, the
same function) and the answer it should write; the loss is the answer's tokens' mean negative
log-likelihood, the prompt masked: the output layer runs on the answer's positions alone (a
batch of 8 Plan-Path demonstrations of ~600 tokens made 8 x 600 x 49,152 logits, most of them the
prompt's; the whole fine-tune held ~11 GB). Batches are drawn from one shuffled order an epoch, of
neighbouring lengths so padding costs little. The weights train in float32 (optionally under
bf16 autocast) and are saved in the base model's dtype (what every pool then loads)."""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atgrpo.models.chat import chat_tokens
from atgrpo.sdk.demos import Demo

IGNORE = -100


@dataclass(frozen=True)
class SftStats:
    examples: int
    tokens: int  # answer tokens trained on, an epoch
    epochs: int
    steps: int
    seconds: float
    loss_first: float  # the first epoch's mean loss
    loss_last: float  # the last epoch's

    def line(self) -> str:
        return (
            f"{self.examples} demonstrations ({self.tokens} answer tokens), {self.epochs} epochs, "
            f"{self.steps} steps in {self.seconds / 60:.1f} min; loss {self.loss_first:.3f} -> "
            f"{self.loss_last:.3f}"
        )


def encode(tok, demos: Sequence[Demo], eos: int) -> list[tuple[list[int], int]]:
    """(prompt ids + answer ids + eos, where the answer starts) of each demonstration."""
    out = []
    for d in demos:
        prompt = chat_tokens(tok, d.messages)
        out.append((prompt + tok.encode(d.response, add_special_tokens=False) + [eos], len(prompt)))
    return out


def batches(
    rows: list[tuple[list[int], int]], batch_size: int, rng: random.Random, pad: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(ids, attention mask, labels) batches over `rows` in a shuffled order: the order is
    chunked into runs of 8 batches, each run sorted by length before it is cut into batches."""
    order = list(range(len(rows)))
    rng.shuffle(order)
    run = batch_size * 8
    out = []
    for i in range(0, len(order), run):
        chunk = sorted(order[i : i + run], key=lambda j: len(rows[j][0]))
        for b in range(0, len(chunk), batch_size):
            picked = [rows[j] for j in chunk[b : b + batch_size]]
            width = max(len(ids) for ids, _ in picked)
            ids = [r + [pad] * (width - len(r)) for r, _ in picked]
            mask = [[1] * len(r) + [0] * (width - len(r)) for r, _ in picked]
            labels = [
                [IGNORE] * start + r[start:] + [IGNORE] * (width - len(r)) for r, start in picked
            ]
            out.append((torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)))
    rng.shuffle(out)
    return out


def answer_loss(
    model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, tokens: int | None = None
) -> torch.Tensor:
    """The negative log-likelihood of the labelled tokens over `tokens` (default: how many there
    are: their mean, as the model's own `labels=` loss computes it; position t predicts label
    t + 1), with logits made only where a label is. A micro-batch passes its whole batch's count,
    so that its parts' losses add up to the batch's mean."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    nll = torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum")
    return nll / (int(keep.sum()) if tokens is None else tokens)


def batch_backward(
    model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, micro: int, bf16: bool
) -> float:
    """The batch's mean answer loss, its gradient accumulated `micro` rows at a time, each part
    cut to its own longest row (a batch's rows are of neighbouring lengths, right-padded)."""
    tokens = int((labels[:, 1:] != IGNORE).sum())
    total = 0.0
    for first in range(0, ids.shape[0], micro):
        rows = slice(first, first + micro)
        width = int(mask[rows].sum(-1).max())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = answer_loss(
                model, ids[rows, :width], mask[rows, :width], labels[rows, :width], tokens
            )
        loss.backward()
        total += loss.item()
    return total


def sft(
    base: str | Path,
    out: str | Path,
    demos: Sequence[Demo],
    *,
    epochs: int = 2,
    lr: float = 1e-5,
    batch_size: int = 8,
    micro_batch: int = 2,
    seed: int = 0,
    bf16: bool = False,
) -> SftStats:
    """Copy the model at `base` to `out`, fine-tuned on `demos`; what it trained and how long.
    `bf16`: the forward and backward under bf16 autocast over the float32 weights, as the pools'
    bf16 update runs (on a CPU with bf16 instructions, ~2.5x faster matmuls). Each optimizer step
    is one batch, its forward run `micro_batch` rows at a time (activation memory: SmolLM2 on 8
    Plan-Path demonstrations at once held 7.6 GB)."""
    if not demos:
        raise ValueError("no demonstrations to train on")
    if epochs < 1 or batch_size < 1 or micro_batch < 1 or lr <= 0:
        raise ValueError("epochs, batch_size and micro_batch must be >= 1 and lr > 0")
    start = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    if Path(base).resolve() != Path(out).resolve():
        shutil.copytree(base, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    saved_dtype = model.dtype
    model = model.float()
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    rows = encode(tok, demos, eos)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    steps = 0
    for _ in range(epochs):
        total = 0.0
        epoch = batches(rows, batch_size, rng, pad)
        for ids, mask, labels in epoch:
            total += batch_backward(model, ids, mask, labels, micro_batch, bf16)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
        losses.append(total / len(epoch))
    model.to(saved_dtype).save_pretrained(out)
    return SftStats(
        examples=len(rows),
        tokens=sum(len(ids) - s for ids, s in rows),
        epochs=epochs,
        steps=steps,
        seconds=time.perf_counter() - start,
        loss_first=losses[0],
        loss_last=losses[-1],
    )

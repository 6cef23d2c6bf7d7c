"""Prompt sharing in the chunked log-prob path (trainer_svc/logprobs.py): rows with the same
prompt (the K branches of one (task, agent, turn) group) run that prompt through the decoder once,
and their responses attend to its keys and values. Which rows share a prompt, whether a model can
take the cache, and the decoder pass that computes each distinct prompt once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from atgrpo.contract.trainer import TrainSample
from trainer_svc.sharding import is_sharded


def prompt_groups(batch: Sequence[TrainSample]) -> tuple[list[int], list[Sequence[int]]]:
    """Each row's group (rows with the same prompt ids share one) and each group's prompt, in
    order of first appearance."""
    first: dict[tuple[int, ...], int] = {}
    rows = [first.setdefault(tuple(s.prompt_ids), len(first)) for s in batch]
    return rows, list(first)


def prefix_sharing_available(model) -> bool:
    """Whether the decoder can take a batch's prompts as a key/value cache for its responses.
    Not under gradient checkpointing: Hugging Face's checkpointed layers drop the cache in
    training; those models run the unshared path. Not under FSDP either: each layer would run
    two forwards (the prompts, then the responses) before one backward."""
    return not getattr(model, "is_gradient_checkpointing", False) and not is_sharded(model)


def _shared_prompt_hidden(decoder, batch: Sequence[TrainSample], device: str) -> torch.Tensor:
    """(B, T, H) last hidden states predicting each response token, computing each distinct
    prompt once: the U distinct prompts (left-padded) run as one batch that keeps its keys and
    values; the cache is gathered to the B rows (an index, so its gradient sums over a group's
    rows) and the right-padded responses run on it at their own positions. The state that
    predicts a response's first token is its prompt's last one. Rows and positions are the
    unshared path's, so each number is too, up to float rounding (attention sums in a
    different order); the gradient reaches a shared prompt's activations from every row of
    its group, which is what the unshared backward adds up row by row.

    Work: U x P + B x T positions instead of B x (P + T); at K branches a group with prompts
    r times the response length, (r/K + 1) / (r + 1) of it."""
    from transformers import DynamicCache

    group, prompts = prompt_groups(batch)
    p_max = max(len(p) for p in prompts)
    t_max = max(len(s.response_ids) for s in batch)
    p_ids = torch.zeros((len(prompts), p_max), dtype=torch.long)
    p_attn = torch.zeros_like(p_ids)
    for u, p in enumerate(prompts):
        p_ids[u, p_max - len(p) :] = torch.tensor(list(p))
        p_attn[u, p_max - len(p) :] = 1
    p_pos = (p_attn.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = decoder(
        input_ids=p_ids.to(device),
        attention_mask=p_attn.to(device),
        position_ids=p_pos.to(device),
        past_key_values=cache,
        use_cache=True,
    )
    rows = torch.tensor(group, device=device)
    cache.batch_select_indices(rows)
    r_ids = torch.zeros((len(batch), t_max), dtype=torch.long)
    r_attn = torch.cat([p_attn[group], torch.zeros((len(batch), t_max), dtype=torch.long)], dim=1)
    for i, s in enumerate(batch):
        r_ids[i, : len(s.response_ids)] = torch.tensor(list(s.response_ids))
        r_attn[i, p_max : p_max + len(s.response_ids)] = 1
    r_pos = torch.tensor([len(s.prompt_ids) for s in batch])[:, None] + torch.arange(t_max)
    resp = decoder(
        input_ids=r_ids.to(device),
        attention_mask=r_attn.to(device),
        position_ids=r_pos.to(device),
        past_key_values=cache,
        use_cache=True,
    )
    last = out.last_hidden_state[:, -1][rows]  # (B, H): predicts each first response token
    return torch.cat([last[:, None], resp.last_hidden_state[:, : t_max - 1]], dim=1)

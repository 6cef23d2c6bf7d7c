"""Does each pool's model allow the context its agents need? (`atgrpo config check`)

A pool's engines are started with a context of RunConfig.context_tokens (the longest
max_prompt_tokens + max_tokens of its agents); vLLM refuses to start with more than the model's
own limit, so a too-small model is named here, before any service starts.
"""

from __future__ import annotations

import json

from atgrpo.config import RunConfig
from atgrpo.plan import find_model_config


def model_limit(model_path: str) -> int | None:
    """The model's own context (config.json max_position_embeddings); None when unknown, or when
    rope_scaling stretches it (the engine's figure then depends on the scaling type: not
    guessed)."""
    path = find_model_config(model_path)
    if path is None:
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    limit = config.get("max_position_embeddings")
    if not isinstance(limit, int) or config.get("rope_scaling"):
        return None
    return limit


def longest_agent(cfg: RunConfig, pool: str) -> tuple[str, int, int]:
    """(the agent sampling setting that needs the most context, its max_prompt_tokens, its
    max_tokens)."""
    options = [
        (
            s.max_prompt_tokens + s.max_tokens,
            f"agents.{a}.{which}",
            s.max_prompt_tokens,
            s.max_tokens,
        )
        for a in cfg.agents_of(pool)
        for which in ("train_sampling", "eval_sampling")
        for s in (getattr(cfg.agents[a], which),)
    ]
    _, where, prompt, response = max(options)
    return where, prompt, response


def context_problems(cfg: RunConfig) -> list[str]:
    """One line per pool whose model allows less context than its agents need, with the fix."""
    problems = []
    for name, pool in cfg.pools.items():
        need, limit = cfg.context_tokens(name), model_limit(pool.model_path)
        if limit is None or need <= limit:
            continue
        where, prompt, response = longest_agent(cfg, name)
        problems.append(
            f"pools.{name}: its agents need a context of {need} tokens ({where}: max_prompt_tokens "
            f"{prompt} + max_tokens {response}), but model {pool.model_path!r} allows {limit} "
            f"(max_position_embeddings in its config.json). Lower max_prompt_tokens or max_tokens "
            f"so they sum to at most {limit}, or use a "
            "model with a longer context"
        )
    return problems

"""`atgrpo config check`: is the config valid, does its env fit it, and does each pool's model allow
the context its agents need?

A pool's engines are started with a context of RunConfig.context_tokens (the longest
max_prompt_tokens + max_tokens of its agents); vLLM refuses to start with more than the model's
own limit, so a too-small model is named here, before any service starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atgrpo.cli.preflight import env_problem, load_run_config
from atgrpo.config import RunConfig
from atgrpo.model_shape import find_model_config


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


def add_command(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser("config", help="run configs").add_subparsers(dest="what", required=True)
    check = config.add_parser("check", help="validate a run config and say what to fix")
    check.add_argument("config", type=Path)
    check.set_defaults(fn=_cmd_config_check)


def _cmd_config_check(args: argparse.Namespace) -> int:
    cfg = load_run_config(args)
    if cfg is None:
        return 2
    problem = env_problem(cfg)
    if problem:
        print(f"{args.config}: {problem}", file=sys.stderr)
        return 2
    short = context_problems(cfg)  # vLLM would refuse to start these pools' engines
    if short:
        print(
            f"{args.config}: a model's context is too small\n" + "\n".join(short), file=sys.stderr
        )
        return 2
    mode = "local" if cfg.local_mode else "connect"
    print(
        f"{args.config}: ok ({cfg.level}, {len(cfg.agents)} agents on {len(cfg.pools)} pools, "
        f"{mode} mode)"
    )
    return 0

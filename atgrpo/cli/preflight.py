"""Checks `atgrpo config check`, `train` and `eval` run in this process before any service starts,
so a config that cannot run fails in a second, not after five services have started."""

from __future__ import annotations

import argparse
import sys

from atgrpo.config import RunConfig
from atgrpo.sdk.registry import import_from_here


def env_problem(cfg: RunConfig) -> str | None:
    """The router's start-of-run env check, run here on the env built in this process from the same
    registry (entry points, and env.path under env.name): None when the env fits the config, else
    a heading line (could not be loaded / could not be built / does not fit) and what to change."""
    from atgrpo import env_check
    from atgrpo.errors import AtgrpoError, NotFound

    import_from_here()
    name = cfg.env.name
    try:
        spec = env_check.local_spec(cfg)
    except NotFound as err:
        if cfg.local_mode:  # the env service `atgrpo train` starts would not have it either
            named = env_check.not_found(err, cfg.env)
            return f"env {name!r} could not be loaded\n{type(named).__name__}: {named.message}"
        # A cluster's env service may host envs this machine cannot import.
        print(
            f"note: env {name!r} could not be built here ({err.message}); the router checks it "
            f"against the config when the run starts, on the env service at {cfg.services.env}",
            file=sys.stderr,
        )
        return None
    except AtgrpoError as err:  # as a failed run's error reads: "EnvCodeError: env 'x' ..."
        return (
            f"env {name!r} could not be built with this config\n{type(err).__name__}: {err.message}"
        )
    problems = env_check.spec_problems(cfg.env, spec)
    if problems:
        return f"env {name!r} does not fit this config\nInvalidArgument: " + "; ".join(problems)
    return None


def load_run_config(args: argparse.Namespace, **overrides) -> RunConfig | None:
    """The run config at args.config, or None after saying why it is invalid."""
    from atgrpo.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
        return cfg.with_overrides(**overrides) if overrides else cfg
    except ConfigError as err:
        print(f"{args.config}: invalid config\n{err}", file=sys.stderr)
        return None


def load_for_run(args: argparse.Namespace, command: str) -> RunConfig | None:
    """The config with the command line's overrides, once its env is built here and fits it (a
    bad env.path fails in a second, before any service starts); None after saying why not."""
    cfg = load_run_config(
        args, steps=getattr(args, "steps", None), run_dir=getattr(args, "run_dir", None)
    )
    problem = env_problem(cfg) if cfg is not None else None
    if problem:
        print(f"atgrpo {command}: {args.config}: {problem}", file=sys.stderr)
        return None
    return cfg

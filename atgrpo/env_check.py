"""Does the environment agree with the run config? One check for the router and
`atgrpo config check`.

The router asks the env service for the env's spec (Describe) when a run starts; `atgrpo config
check` builds the same env in its own process, from the same table of built-ins and the config's
env.path. Both compare the spec with the config here, so a mismatch reads the same wherever it is
found, and is found before five services are started rather than after.
"""

from __future__ import annotations

from atgrpo.config import EnvConfig, RunConfig
from atgrpo.contract.env import TURN_ORDER_OPTION, EnvSpec
from atgrpo.errors import InvalidArgument, NotFound


def env_options(cfg: RunConfig) -> dict:
    """The env's options, with the config's turn order (an env runs fewer roles at L0 from it)."""
    return {**cfg.env.options, TURN_ORDER_OPTION: list(cfg.env.turn_order)}


def parallel_problem(config_parallel: bool, spec_parallel: bool, env_name: str) -> str | None:
    """None when the run config's env.parallel equals the env's own EnvSpec.parallel (under the
    run's options); else what to change. The tree driver plays turns the config's way, so an env
    scored for the other way would hand out the wrong rewards."""
    if bool(config_parallel) == bool(spec_parallel):
        return None
    want = "true" if spec_parallel else "false"
    ways = {
        True: "in parallel (every agent acts on the turn's starting state)",
        False: "sequentially (each agent sees the previous agent's move)",
    }
    return (
        f"env.parallel is {str(bool(config_parallel)).lower()}, but env {env_name!r} with these "
        f"options plays its turns {ways[bool(spec_parallel)]}: set env.parallel: {want} to match, "
        f"or change the env's own option (for the built-in envs, env.options.parallel: "
        f"{str(bool(config_parallel)).lower()})"
    )


def spec_problems(env: EnvConfig, spec: EnvSpec) -> list[str]:
    """Each way the env's spec (under the run's options) disagrees with the config, with its fix."""
    problems = []
    unknown = [a for a in env.turn_order if a not in spec.agents]
    if unknown:
        problems.append(
            f"env.turn_order names {unknown}, which env {env.name!r} does not have "
            f"(its agents: {list(spec.agents)})"
        )
    elif tuple(env.turn_order) != tuple(spec.turn_order):
        problems.append(
            f"env.turn_order is {list(env.turn_order)}, but env {env.name!r} with these options "
            f"acts in the order {list(spec.turn_order)}: make them the same"
        )
    parallel = parallel_problem(env.parallel, spec.parallel, env.name)
    if parallel:
        problems.append(parallel)
    if env.max_turns > spec.max_turns:
        problems.append(
            f"env.max_turns is {env.max_turns}, over the {spec.max_turns} turns env {env.name!r} "
            "allows with these options (its spec's max_turns): lower env.max_turns, or raise the "
            "env's own limit (for the built-in envs, env.options.max_turns)"
        )
    return problems


def check_spec(env: EnvConfig, spec: EnvSpec) -> None:
    """Raises InvalidArgument naming every disagreement (the run cannot work until it is fixed)."""
    problems = spec_problems(env, spec)
    if problems:
        raise InvalidArgument("; ".join(problems))


def not_found(err: NotFound, env: EnvConfig) -> InvalidArgument:
    """No env of the config's name: no retry will change that, so say where envs come from."""
    hint = (
        f"env.path is {env.path!r}: `atgrpo train` and `atgrpo eval` load it in the folder they "
        "are run from"
        if env.path
        else "For your own environment, set env.path: 'package.module:Class' (atgrpo train starts "
        "the env service with it), or serve it with `atgrpo env serve` / `python -m env_svc "
        "--env-path NAME=...` and give that address as services.env"
    )
    return InvalidArgument(f"{err.message.rstrip('.')}. {hint}")


def name_problem(env: EnvConfig, cls_name: str, cls: type) -> str | None:
    """With env.path, env.name must be the class's own `name` (the name configs use): a config
    naming it otherwise would point other tools (entry points, env serve) at another env."""
    if not cls_name or cls_name == env.name:
        return None
    return (
        f"env.name is {env.name!r}, but env.path's class {cls.__module__}.{cls.__qualname__} is "
        f"named {cls_name!r} (its `name`): set env.name: {cls_name}"
    )


def local_spec(cfg: RunConfig) -> EnvSpec:
    """The env's spec under the run's options, built here as the env service `atgrpo train` starts
    would build it (the same registry: the entry points, built-ins among them, and env.path under
    env.name).
    Raises what Describe would: NotFound for an env of no such name, InvalidArgument for options
    the env refuses, EnvCodeError for a bug in the env's own code."""
    from atgrpo.sdk.host import EnvHost
    from atgrpo.sdk.registry import Registry

    env = cfg.env
    registry = Registry({env.name: env.path} if env.path else {})
    if env.path:
        cls = registry.get(env.name)
        problem = name_problem(env, getattr(cls, "name", ""), cls)
        if problem:
            raise InvalidArgument(problem)
    return EnvHost(registry).describe(env.name, env_options(cfg))

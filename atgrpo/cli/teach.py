"""`atgrpo model teach`: a tiny model taught to answer an env's roles in its answer format.

A random tiny model never writes an answer a new env can parse, so every sample scores the same
and a smoke run trains on nothing (zero advantages, zero loss). A few hundred supervised steps on
the env's own first-turn prompts, with example answers per role, fix that in seconds on a CPU:
the taught model answers with one of the examples, chosen at random (atgrpo.models.taught)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from atgrpo.sdk.registry import import_from_here


def add_command(model: argparse._SubParsersAction) -> None:
    p = model.add_parser(
        "teach",
        help="teach a (tiny) model an env's answer format from example answers, for smoke runs",
    )
    p.add_argument("--base", required=True, type=Path, help="the model to start from (a folder)")
    p.add_argument(
        "--examples",
        required=True,
        type=Path,
        help="YAML or JSON: each agent's example answers, {agent: [answer, ...]} (or one answer)",
    )
    p.add_argument("--out", required=True, type=Path, help="the folder to write the model to")
    p.add_argument("--config", type=Path, default=None, help="a run config: its env and options")
    p.add_argument("--env", default=None, help="package.module:Class or a name (else --config's)")
    p.add_argument("--options", default="{}", help="the env's options as JSON")
    p.add_argument("--tasks", type=int, default=8, help="train tasks whose prompts are taught")
    p.add_argument("--steps", type=int, default=300, help="supervised steps (default 300)")
    p.set_defaults(fn=run)


def read_examples(path: Path) -> dict[str, list[str]]:
    """{agent: [answers]} from a YAML/JSON file; ValueError naming the fix."""
    import yaml

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: write a mapping of agent to its example answers")
    out = {}
    for agent, answers in data.items():
        answers = [answers] if isinstance(answers, str) else answers
        if not (isinstance(answers, list) and answers and all(isinstance(a, str) for a in answers)):
            raise ValueError(f"{path}: {agent!r} needs an answer or a list of answers (strings)")
        out[str(agent)] = answers
    return out


async def first_prompts(
    target: str, options: dict, agents: list[str], tasks: int
) -> list[tuple[str, list[dict]]]:
    """(agent, its first-turn messages) over the env's first `tasks` train tasks (its own task ids
    where it lists them), built by the host the env service runs (async envs included)."""
    from atgrpo.contract.env import seed_for
    from atgrpo.sdk.host import EnvHost
    from atgrpo.sdk.registry import registry_for

    name, registry = registry_for(target)
    host = EnvHost(registry)
    ids, _ = host.list_tasks(name, "train", 0, tasks, options)
    out = []
    for i in range(tasks):
        task = ids[i % len(ids)] if ids else f"train-{i}"
        episode, spec = await host.reset(name, task, seed_for("train", i), "train", options)
        unknown = [a for a in agents if a not in spec.agents]
        if unknown:
            raise ValueError(
                f"env {name!r} has no agent {unknown[0]!r} (its agents: {spec.agents})"
            )
        for agent in agents:
            out.append((agent, (await host.observe(episode, agent))[0]))
        host.close([episode])
    return out


def run(args: argparse.Namespace) -> int:
    from atgrpo.errors import AtgrpoError

    import_from_here()
    target, options = args.env, {}
    if args.config is not None:
        from atgrpo import env_check
        from atgrpo.config import ConfigError, load_config

        try:
            cfg = load_config(args.config)
        except ConfigError as err:
            print(f"{args.config}: invalid config\n{err}", file=sys.stderr)
            return 2
        target = target or cfg.env.path or cfg.env.name
        options = env_check.env_options(cfg)
    if target is None:
        print(
            "atgrpo model teach: give --env or --config (whose prompts to teach)", file=sys.stderr
        )
        return 2
    try:
        options.update(json.loads(args.options))
        examples = read_examples(args.examples)
        prompts = asyncio.run(first_prompts(target, options, list(examples), args.tasks))
    except (OSError, ValueError, AtgrpoError) as err:
        print(f"atgrpo model teach: {getattr(err, 'message', err)}", file=sys.stderr)
        return 2
    from atgrpo.models.taught import teach

    print(teach(args.base, args.out, prompts, examples, steps=args.steps))
    return 0

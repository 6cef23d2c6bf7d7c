"""`atgrpo model teach` and `atgrpo model demos`: supervised warm starts.

A model that never writes an answer its env can parse scores the same on every sample, and a run
trains on nothing (zero advantages, zero loss). Two ways to fix that:
- `teach --examples`: a tiny model taught, in seconds on a CPU, to answer each role's first-turn
  prompts with one of a few fixed example answers (the format, for smoke runs;
  atgrpo.models.taught);
- `demos` then `teach --demos`: train episodes played with the env's own solver (or a program
  the user names), each agent's prompt and right answer written as JSONL (atgrpo.sdk.demos), and
  a real model fine-tuned on them (atgrpo.models.sft): a warm start a user can reproduce."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from atgrpo.sdk.registry import import_from_here


def add_command(model: argparse._SubParsersAction) -> None:
    p = model.add_parser(
        "teach",
        help="teach a (tiny) model an env's answer format from example answers, for smoke runs",
    )
    p.add_argument("--base", required=True, type=Path, help="the model to start from (a folder)")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--examples",
        type=Path,
        help="YAML or JSON: each agent's example answers, {agent: [answer, ...]} (or one answer)",
    )
    given.add_argument(
        "--demos",
        type=Path,
        help="JSONL of demonstrations (`atgrpo model demos` writes them): fine-tune on them",
    )
    p.add_argument("--out", required=True, type=Path, help="the folder to write the model to")
    p.add_argument("--epochs", type=int, default=2, help="with --demos: passes over them")
    p.add_argument("--lr", type=float, default=1e-5, help="with --demos: AdamW learning rate")
    p.add_argument("--batch-size", type=int, default=8, help="with --demos: examples a step")
    p.add_argument("--seed", type=int, default=0, help="with --demos: the shuffle's seed")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="with --demos: bf16 autocast (faster on CPUs with bf16 instructions, and GPUs)",
    )
    p.add_argument("--config", type=Path, default=None, help="a run config: its env and options")
    p.add_argument("--env", default=None, help="package.module:Class or a name (else --config's)")
    p.add_argument("--options", default="{}", help="the env's options as JSON")
    p.add_argument("--tasks", type=int, default=8, help="train tasks whose prompts are taught")
    p.add_argument("--steps", type=int, default=300, help="supervised steps (default 300)")
    p.set_defaults(fn=run)
    d = model.add_parser(
        "demos",
        help="play train episodes with the env's own solver and write each agent's prompt and "
        "answer, for `teach --demos`",
    )
    d.add_argument("--out", required=True, type=Path, help="the JSONL file to write")
    d.add_argument("--config", type=Path, default=None, help="a run config: its env and options")
    d.add_argument("--env", default=None, help="package.module:Class or a name (else --config's)")
    d.add_argument("--options", default="{}", help="the env's options as JSON (over the config's)")
    d.add_argument("--episodes", type=int, default=200, help="train episodes to play")
    d.add_argument(
        "--solver",
        default=None,
        help="package.module:function(agent, messages) -> answer, for agents the env has no "
        "demonstration for",
    )
    d.add_argument(
        "--sandbox",
        default="",
        help="for envs that run agents' programs: a sandbox_svc address, or 'local' to start one "
        "for this command",
    )
    d.set_defaults(fn=run_demos)


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
            messages, _ = await host.observe(episode, agent)
            if messages:  # an agent that does not act at the start has no first-turn prompt
                out.append((agent, messages))
        host.close([episode])
    return out


def env_of(args: argparse.Namespace, command: str) -> tuple[str, dict] | None:
    """(env target, its options) from --env/--config/--options, or None once the error is told."""
    target, options = args.env, {}
    if args.config is not None:
        from atgrpo import env_check
        from atgrpo.config import ConfigError, load_config

        try:
            cfg = load_config(args.config)
        except ConfigError as err:
            print(f"{args.config}: invalid config\n{err}", file=sys.stderr)
            return None
        target = target or cfg.env.path or cfg.env.name
        options = env_check.env_options(cfg)
    if target is None:
        print(f"atgrpo model {command}: give --env or --config (whose env)", file=sys.stderr)
        return None
    try:
        extra = json.loads(args.options)
    except ValueError as err:
        print(f"atgrpo model {command}: --options is not JSON ({err})", file=sys.stderr)
        return None
    if not isinstance(extra, dict):
        print(f"atgrpo model {command}: --options must be a JSON object", file=sys.stderr)
        return None
    return target, {**options, **extra}


def run(args: argparse.Namespace) -> int:
    from atgrpo.errors import AtgrpoError

    import_from_here()
    if args.demos is not None:
        return run_sft(args)
    what = env_of(args, "teach")
    if what is None:
        return 2
    target, options = what
    try:
        examples = read_examples(args.examples)
        prompts = asyncio.run(first_prompts(target, options, list(examples), args.tasks))
    except (OSError, ValueError, AtgrpoError) as err:
        print(f"atgrpo model teach: {getattr(err, 'message', err)}", file=sys.stderr)
        return 2
    from atgrpo.models.taught import teach

    print(teach(args.base, args.out, prompts, examples, steps=args.steps))
    return 0


def run_sft(args: argparse.Namespace) -> int:
    from atgrpo.models.sft import sft
    from atgrpo.sdk import demos

    try:
        rows = demos.read(args.demos)
        stats = sft(
            args.base,
            args.out,
            rows,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            seed=args.seed,
            bf16=args.bf16,
        )
    except (OSError, ValueError) as err:
        print(f"atgrpo model teach: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: {stats.line()}")
    return 0


def load_solver(spec: str):
    """The function `package.module:function` names; ValueError saying what to write."""
    import importlib

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--solver {spec!r}: write package.module:function")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"--solver {spec!r}: {module} has no function {name!r}")
    return fn


@contextlib.contextmanager
def sandbox_at(spec: str) -> Iterator[str]:
    """The sandbox address `spec` names: "" none, "local" one started here until the block ends
    (sandbox_svc, as `atgrpo up` starts it), else `spec` itself."""
    if spec != "local":
        yield spec
        return
    from atgrpo.cli.launcher import ServiceProcess, down, up

    with tempfile.TemporaryDirectory() as state:
        (sandbox,) = up(Path(state), (ServiceProcess("sandbox", "sandbox"),))
        try:
            yield sandbox.address
        finally:
            down(Path(state))


def run_demos(args: argparse.Namespace) -> int:
    from atgrpo.errors import AtgrpoError
    from atgrpo.sdk import demos
    from atgrpo.sdk.host import EnvHost
    from atgrpo.sdk.registry import registry_for

    import_from_here()
    what = env_of(args, "demos")
    if what is None:
        return 2
    target, options = what

    async def played(address: str):
        sandbox = None
        if address:
            from sandbox_svc.client import SandboxClient

            sandbox = SandboxClient(address)
        name, registry = registry_for(target)
        return await demos.play(
            EnvHost(registry, sandbox=sandbox), name, options, args.episodes, solver=solver
        )

    try:
        solver = load_solver(args.solver) if args.solver else None
        with sandbox_at(args.sandbox) as address:
            rows, stats = asyncio.run(played(address))
    except (ImportError, ValueError, AtgrpoError) as err:
        said = str(getattr(err, "message", err))
        if "sandbox" in said and not args.sandbox:
            said += "; here: --sandbox ADDRESS, or --sandbox local to start one"
        print(f"atgrpo model demos: {said}", file=sys.stderr)
        return 2
    if not rows:
        print(
            f"atgrpo model demos: none of {stats.episodes} episodes succeeded with the "
            "demonstrations: nothing written (does the env need --sandbox?)",
            file=sys.stderr,
        )
        return 1
    demos.write(rows, args.out)
    print(
        f"{args.out}: {stats.demos} demonstrations from {stats.kept} of {stats.episodes} "
        "episodes (those that succeeded)"
    )
    return 0

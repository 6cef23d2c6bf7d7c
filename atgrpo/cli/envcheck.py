"""`atgrpo env check TARGET`: the conformance suite (atgrpo.sdk.check) from the shell."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

from atgrpo.sdk.registry import import_from_here


def add_command(env: argparse._SubParsersAction) -> None:
    p = env.add_parser(
        "check",
        help="check that an environment keeps the rules atgrpo trains on (in process, seconds)",
    )
    p.add_argument(
        "target",
        nargs="?",
        default=None,
        help="package.module:Class, or the name of an installed env; default: the --config's env",
    )
    p.add_argument("--config", type=Path, default=None, help="a run config: its env and options")
    p.add_argument("--options", default=None, help="the env's options as JSON (over the config's)")
    p.add_argument("--tasks", type=int, default=3, help="tasks of each split to play (default 3)")
    p.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="a file of example answers (one per line, or a JSON list) played before the probes",
    )
    p.add_argument(
        "--sandbox",
        default="",
        help="a sandbox_svc address, for envs that run code (`atgrpo up` starts one)",
    )
    p.add_argument("--json", action="store_true", help="the findings as JSON")
    p.set_defaults(fn=run)


def _examples(path: Path | None) -> list[str]:
    if path is None:
        return []
    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        return [line for line in text.splitlines() if line.strip()]
    if not (isinstance(data, list) and all(isinstance(x, str) for x in data)):
        raise ValueError(f"{path}: give a JSON list of strings, or one answer per line")
    return data


def _what(args: argparse.Namespace) -> tuple[str, dict, Callable | None] | str:
    """(target, options, the config's disagreements with a spec), or what is wrong with the
    command line."""
    options: dict = {}
    problems = None
    target = args.target
    if args.config is not None:
        from atgrpo import env_check
        from atgrpo.config import ConfigError, load_config

        try:
            cfg = load_config(args.config)
        except ConfigError as err:
            return f"{args.config}: invalid config\n{err}"
        target = target or cfg.env.path or cfg.env.name
        options = env_check.env_options(cfg)

        def problems(spec):  # on the spec the suite builds: the env is built once
            return env_check.spec_problems(cfg.env, spec)

    if target is None:
        return "give an env (package.module:Class or a name) or --config FILE"
    if args.options is not None:
        try:
            extra = json.loads(args.options)
        except ValueError as err:
            return f"--options is not JSON ({err}): write e.g. '{{\"max_turns\": 3}}'"
        if not isinstance(extra, dict):
            return "--options must be a JSON object"
        options.update(extra)
    return target, options, problems


def run(args: argparse.Namespace) -> int:
    from atgrpo.errors import AtgrpoError
    from atgrpo.sdk.check import check_env_async

    import_from_here()
    what = _what(args)
    if isinstance(what, str):
        print(f"atgrpo env check: {what}", file=sys.stderr)
        return 2
    target, options, problems = what
    try:
        examples = _examples(args.examples)
    except (OSError, ValueError) as err:
        print(f"atgrpo env check: {err}", file=sys.stderr)
        return 2

    async def checked():
        sandbox = None
        if args.sandbox:
            from sandbox_svc.client import SandboxClient

            sandbox = SandboxClient(args.sandbox)
        return await check_env_async(
            target,
            options,
            sandbox=sandbox,
            tasks=args.tasks,
            examples=examples,
            config_problems=problems,
        )

    try:
        report = asyncio.run(checked())
    except AtgrpoError as err:  # the target itself: no such name, no such module
        print(f"atgrpo env check: {type(err).__name__}: {err.message}", file=sys.stderr)
        return 2
    if args.json:
        findings = [
            {"rule": f.rule, "warning": f.warning, "message": f.message} for f in report.findings
        ]
        print(json.dumps({"env": report.env, "ok": report.ok, "findings": findings}, indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1

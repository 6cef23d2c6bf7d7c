"""The `atgrpo` command: train, eval and plot runs; local services (up/status/down); tiny
models; config checks; serving an environment class. Each module below registers its own
subcommands (add_command) with their arguments and handlers."""

from __future__ import annotations

import argparse

from atgrpo import __version__
from atgrpo.cli import (
    context,
    env,
    fit_report,
    model,
    report,
    runner,
    samples,
    scale,
    services,
    submit,
)

# in the order `atgrpo --help` lists their commands
COMMANDS = (
    model,  # model tiny | teach | smollm2
    env,  # env serve | check
    samples,
    context,  # config check
    fit_report,  # plan
    runner,  # train, eval
    report,  # plot
    services,  # up, status, down
    scale,
    submit,  # submit, runs
)


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"atgrpo {__version__}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="atgrpo", description="Train teams of LLM agents with AT-GRPO."
    )
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version").set_defaults(fn=_cmd_version)
    for module in COMMANDS:
        module.add_command(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    # argparse leaves a REMAINDER that starts with an option (`env serve --help`, `env serve --port
    # 5 mod:Class`) out of it, as unrecognized: such arguments belong to the passthrough command.
    args, extras = ap.parse_known_args(argv)
    if extras:
        if not getattr(args, "passthrough", False):
            ap.error(f"unrecognized arguments: {' '.join(extras)}")
        args.rest = [*extras, *args.rest]
    code = args.fn(args)
    if argv is None:  # run as the program (its arguments from the command line): it exits next
        from atgrpo.rpc.main import skip_exit_collection

        skip_exit_collection()
    return code

"""`atgrpo env`: serving one Environment class as an EnvService (serve) and checking one against
the rules atgrpo trains on (envcheck.py)."""

from __future__ import annotations

import argparse

from atgrpo.cli import envcheck


def add_command(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="environments").add_subparsers(dest="what", required=True)
    serve = env.add_parser(
        "serve", help="serve one Environment class as an EnvService", add_help=False
    )
    serve.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        help="package.module:Class [--port N] [--sandbox HOST:PORT] ... (see --help)",
    )
    # serve_main parses `rest`, --help included
    serve.set_defaults(fn=_cmd_env_serve, passthrough=True)
    envcheck.add_command(env)


def _cmd_env_serve(args: argparse.Namespace) -> int:
    from atgrpo.sdk.serve import serve_main

    serve_main(args.rest)
    return 0

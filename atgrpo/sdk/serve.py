"""`atgrpo env serve package.module:Class`: serve one environment class as an EnvService.

A user adds an environment without touching atgrpo: write the class, serve it in its own
process, and point the run config's `services.env` (or the rollout service) at its address.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from atgrpo.errors import AtgrpoError
from atgrpo.rpc.main import base_parser, run_service
from atgrpo.rpc.server import Binding
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry, load_class
from atgrpo.sdk.servicer import env_bindings
from atgrpo.sdk.store import EpisodeStore


def add_host_flags(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--sandbox", default="", metavar="HOST:PORT",
                    help="sandbox_svc address for environments that run code (none by default)")
    ap.add_argument("--max-episodes", type=int, default=10_000, help="cap on live episodes")
    ap.add_argument("--ttl-s", type=float, default=900.0, help="episodes unused this long are dropped")
    return ap


def build_host(args: argparse.Namespace, registry: Registry) -> EnvHost:
    """An EnvHost for the flags of add_host_flags; call inside the event loop."""
    sandbox = None
    if args.sandbox:
        # The sandbox's own typed client, imported only when a sandbox is configured.
        from sandbox_svc.client import SandboxClient
        sandbox = SandboxClient(args.sandbox)
    host = EnvHost(registry, sandbox=sandbox, store=EpisodeStore(args.max_episodes, args.ttl_s))
    asyncio.get_running_loop().create_task(host.expire_forever())
    return host


def serve_main(argv: Sequence[str] | None = None) -> None:
    ap = add_host_flags(base_parser("env"))
    ap.prog = "atgrpo env serve"
    ap.add_argument("env_class", metavar="package.module:Class", help="the Environment subclass to serve")
    args = ap.parse_args(argv)
    try:
        cls = load_class(args.env_class)
    except AtgrpoError as err:
        raise SystemExit(f"atgrpo env serve: {err.message}") from None
    registry = Registry(discover=False)
    registry.register(cls)

    def build(a: argparse.Namespace) -> list[Binding]:
        return env_bindings(build_host(a, registry), {"served": args.env_class})

    run_service("env", build, argv=argv, parser=ap)

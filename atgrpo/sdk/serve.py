"""`atgrpo env serve package.module:Class`: serve one environment class as an EnvService.

A user adds an environment without touching atgrpo: write the class, serve it in its own
process, and point the run config's `services.env` (or the rollout service) at its address.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from atgrpo.errors import AtgrpoError
from atgrpo.rpc.main import SettingsError, run_service
from atgrpo.rpc.server import Binding
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry, import_from_here, load_class
from atgrpo.sdk.servicer import env_bindings
from atgrpo.sdk.store import EpisodeStore


@dataclass(frozen=True)
class HostSettings:
    """How an EnvService hosts episodes: where code runs, how many live episodes, for how long."""

    sandbox: str = ""  # sandbox_svc address for environments that run code; "" = none
    max_episodes: int = 10_000
    ttl_s: float = 900.0  # episodes unused this long are dropped

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        ap.add_argument(
            "--sandbox",
            default="",
            metavar="HOST:PORT",
            help="sandbox_svc address for environments that run code (none by default)",
        )
        ap.add_argument("--max-episodes", type=int, default=10_000, help="cap on live episodes")
        ap.add_argument(
            "--ttl-s", type=float, default=900.0, help="episodes unused this long are dropped"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HostSettings:
        return cls(**cls.checked(args))

    @staticmethod
    def checked(args: argparse.Namespace) -> dict:
        if args.max_episodes < 1:
            raise SettingsError(
                f"--max-episodes {args.max_episodes}: give how many episodes may be live at once"
            )
        if not args.ttl_s > 0:
            raise SettingsError(
                f"--ttl-s {args.ttl_s}: give the seconds an unused episode is kept (> 0)"
            )
        return {"sandbox": args.sandbox, "max_episodes": args.max_episodes, "ttl_s": args.ttl_s}


def build_host(settings: HostSettings, registry: Registry) -> EnvHost:
    """An EnvHost of these settings; call inside the event loop."""
    sandbox = None
    if settings.sandbox:
        # The sandbox's own typed client, imported only when a sandbox is configured.
        from sandbox_svc.client import SandboxClient

        sandbox = SandboxClient(settings.sandbox)
    host = EnvHost(
        registry, sandbox=sandbox, store=EpisodeStore(settings.max_episodes, settings.ttl_s)
    )
    asyncio.get_running_loop().create_task(host.expire_forever())
    return host


@dataclass(frozen=True)
class ServeEnvSettings(HostSettings):
    env_class: str = ""  # package.module:Class

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        HostSettings.add_flags(ap)
        ap.add_argument(
            "env_class", metavar="package.module:Class", help="the Environment subclass to serve"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeEnvSettings:
        return cls(**HostSettings.checked(args), env_class=args.env_class)


def _bindings(settings: ServeEnvSettings) -> list[Binding]:
    import_from_here()
    try:
        cls = load_class(settings.env_class)
    except AtgrpoError as err:
        raise SystemExit(f"atgrpo env serve: {err.message}") from None
    registry = Registry(discover=False)
    registry.register(cls)
    return env_bindings(build_host(settings, registry), {"served": settings.env_class})


def serve_main(argv: Sequence[str] | None = None) -> None:
    run_service("env", _bindings, ServeEnvSettings, argv=argv, prog="atgrpo env serve")

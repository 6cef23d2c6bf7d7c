"""env_svc: hosts the built-in environments and those installed through entry points.

The EnvService itself is the SDK's (atgrpo.sdk.servicer), so a third-party environment served
with `atgrpo env serve` behaves exactly as one hosted here.
"""

from __future__ import annotations

import argparse

from atgrpo.rpc.server import Binding
from atgrpo.sdk.registry import Registry
from atgrpo.sdk.serve import build_host
from atgrpo.sdk.servicer import env_bindings
from env_svc.envs import BUILTIN


def builtin_registry(extra: dict[str, str] | None = None) -> Registry:
    return Registry({**BUILTIN, **(extra or {})})


def add_env_path_flag(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--env-path", action="append", default=[], metavar="NAME=package.module:Class",
                    help="also host this environment class under NAME (repeatable); the module must "
                         "import from this process's directory or PYTHONPATH")
    return ap


def _env_paths(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not (sep and name and ":" in path):
            raise SystemExit(f"env_svc: --env-path {item!r}: write it as NAME=package.module:Class")
        out[name] = path
    return out


def bindings(args: argparse.Namespace) -> list[Binding]:
    return env_bindings(build_host(args, builtin_registry(_env_paths(getattr(args, "env_path", [])))))

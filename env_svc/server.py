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


def builtin_registry() -> Registry:
    return Registry(BUILTIN)


def bindings(args: argparse.Namespace) -> list[Binding]:
    return env_bindings(build_host(args, builtin_registry()))

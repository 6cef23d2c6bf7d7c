"""env_svc: hosts the built-in environments and those installed through entry points.

The EnvService itself is the SDK's (atgrpo.sdk.servicer), so a third-party environment served
with `atgrpo env serve` behaves exactly as one hosted here.
"""

from __future__ import annotations

from atgrpo.rpc.server import Binding
from atgrpo.sdk.registry import Registry
from atgrpo.sdk.serve import build_host
from atgrpo.sdk.servicer import env_bindings
from env_svc.envs import BUILTIN
from env_svc.settings import EnvSettings


def builtin_registry(extra: dict[str, str] | None = None) -> Registry:
    return Registry({**BUILTIN, **(extra or {})})


def bindings(settings: EnvSettings) -> list[Binding]:
    return env_bindings(build_host(settings, builtin_registry(settings.env_paths)))

"""The env service's settings: the SDK's hosting settings, and your own environments to host."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from atgrpo.rpc.main import SettingsError
from atgrpo.sdk.serve import HostSettings


def parse_env_paths(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not (sep and name and ":" in path):
            raise SettingsError(f"--env-path {item!r}: write it as NAME=package.module:Class")
        out[name] = path
    return out


@dataclass(frozen=True)
class EnvSettings(HostSettings):
    # NAME -> package.module:Class, hosted too
    env_paths: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        HostSettings.add_flags(ap)
        ap.add_argument(
            "--env-path",
            action="append",
            default=[],
            metavar="NAME=package.module:Class",
            help="also host this environment class under NAME (repeatable); the module must "
            "import from this process's directory or PYTHONPATH",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EnvSettings:
        return cls(**HostSettings.checked(args), env_paths=parse_env_paths(args.env_path))

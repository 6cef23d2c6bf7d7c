"""The sandbox service's settings: which backend, how many programs at once, which host uids."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from atgrpo.rpc.main import SettingsError
from sandbox_svc.backends import BACKENDS


@dataclass(frozen=True)
class SandboxSettings:
    backend: str = "bwrap"
    unsafe_no_isolation: bool = False
    workers: int = 0  # programs run at once; 0 = the cores
    queue: int | None = None  # requests that may wait; None = 4 x workers
    # as root, slot i runs programs as host uid uid_base + i; None: a free range
    uid_base: int | None = None
    docker_image: str | None = None

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None:
        ap.add_argument(
            "--backend", choices=BACKENDS, default=os.environ.get("ATGRPO_SANDBOX_BACKEND", "bwrap")
        )
        ap.add_argument(
            "--unsafe-no-isolation",
            action="store_true",
            help="allow --backend subprocess, which runs code without any isolation",
        )
        ap.add_argument(
            "--workers", type=int, default=0, help="programs run at once (0 = the cores)"
        )
        ap.add_argument(
            "--queue", type=int, default=-1, help="requests that may wait (-1 = 4 x workers)"
        )
        ap.add_argument(
            "--uid-base",
            type=int,
            default=None,
            help="as root, worker slot i runs programs as host uid uid_base + i (default: the "
            "first range from 60000 no other sandbox on this host holds)",
        )
        ap.add_argument(
            "--docker-image",
            default=None,
            help="image for --backend docker (default: built locally)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SandboxSettings:
        if args.workers < 0:
            raise SettingsError(
                f"--workers {args.workers}: give how many programs run at once (0 = the cores)"
            )
        if args.queue < -1:
            raise SettingsError(
                f"--queue {args.queue}: give how many requests may wait (0 = none, -1 = 4 x "
                f"workers)"
            )
        if args.uid_base is not None and args.uid_base < 1:
            raise SettingsError(
                f"--uid-base {args.uid_base}: give the first of a range of host uids no user of "
                "this machine holds, or leave it out to take a free range"
            )
        return cls(
            args.backend,
            args.unsafe_no_isolation,
            args.workers,
            None if args.queue < 0 else args.queue,
            args.uid_base,
            args.docker_image,
        )

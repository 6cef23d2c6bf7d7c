"""python -m sandbox_svc: serve the sandbox until SIGTERM.

Refuses to start when the asked-for backend cannot run here, naming the fix.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from atgrpo.rpc.main import run_service
from sandbox_svc.backends import BackendUnavailable, make_backend
from sandbox_svc.executor import Executor
from sandbox_svc.policy import Policy
from sandbox_svc.server import bindings
from sandbox_svc.settings import SandboxSettings
from sandbox_svc.uids import UidClaimError, claim

log = logging.getLogger("sandbox_svc")

UNSAFE_WARNING = (
    "SANDBOX ISOLATION IS OFF (--unsafe-no-isolation): model-written code runs as a plain "
    "process that can read this machine's files and reach its network. Never use this "
    "for training on real data or on a shared machine."
)


class _UnsafeCollector:
    """Says on every scrape, in the metrics and the log, that code runs unisolated."""

    def collect(self):
        log.warning(UNSAFE_WARNING)
        g = GaugeMetricFamily("atgrpo_sandbox_isolation_disabled", UNSAFE_WARNING)
        g.add_metric([], 1.0)
        yield g


def _uid_base(settings: SandboxSettings, workers: int) -> int:
    """The first of this server's host uids, claimed for its lifetime (uids.py): as root, the bwrap
    and subprocess backends sweep a slot's uid, which must be no other sandbox's."""
    if os.geteuid() != 0 or settings.backend == "docker":
        return settings.uid_base or 60000  # unused: programs run as our own uid, or in containers
    held = claim(workers, settings.uid_base)
    atexit.register(held.close)
    log.info("worker slots run as host uids %d-%d", held.base, held.base + workers - 1)
    return held.base


def build(settings: SandboxSettings) -> list:
    workers = settings.workers or os.cpu_count() or 1
    try:
        backend = make_backend(
            settings.backend,
            Policy(),
            unsafe_no_isolation=settings.unsafe_no_isolation,
            uid_base=_uid_base(settings, workers),
            docker_image=settings.docker_image,
        )
    except (BackendUnavailable, UidClaimError) as err:
        sys.exit(f"sandbox: cannot start: {err}")
    if not backend.isolated:
        log.warning(UNSAFE_WARNING)
        print(UNSAFE_WARNING, file=sys.stderr)
        REGISTRY.register(_UnsafeCollector())
    executor = Executor(backend, workers=workers, queue=settings.queue)
    # On a graceful stop, end the warm sandboxes and reap them here: left to --die-with-parent,
    # their pid-1 interpreters would be re-parented to whichever ancestor reaps orphans, as zombies.
    atexit.register(executor.close)
    return bindings(executor)


if __name__ == "__main__":
    run_service("sandbox", build, SandboxSettings)

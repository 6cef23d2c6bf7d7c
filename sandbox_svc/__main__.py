"""python -m sandbox_svc: serve the sandbox until SIGTERM.

Refuses to start when the asked-for backend cannot run here, naming the fix.
"""

from __future__ import annotations

import atexit
import logging
import sys

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from atgrpo.rpc.main import run_service
from sandbox_svc.backends import BackendUnavailable, make_backend
from sandbox_svc.executor import Executor
from sandbox_svc.policy import Policy
from sandbox_svc.server import bindings
from sandbox_svc.settings import SandboxSettings

log = logging.getLogger("sandbox_svc")

UNSAFE_WARNING = ("SANDBOX ISOLATION IS OFF (--unsafe-no-isolation): model-written code runs as a plain "
                  "process that can read this machine's files and reach its network. Never use this "
                  "for training on real data or on a shared machine.")


class _UnsafeCollector:
    """Says on every scrape, in the metrics and the log, that code runs unisolated."""

    def collect(self):
        log.warning(UNSAFE_WARNING)
        g = GaugeMetricFamily("atgrpo_sandbox_isolation_disabled", UNSAFE_WARNING)
        g.add_metric([], 1.0)
        yield g


def build(settings: SandboxSettings) -> list:
    try:
        backend = make_backend(settings.backend, Policy(), unsafe_no_isolation=settings.unsafe_no_isolation,
                               uid_base=settings.uid_base, docker_image=settings.docker_image)
    except BackendUnavailable as err:
        sys.exit(f"sandbox: cannot start: {err}")
    if not backend.isolated:
        log.warning(UNSAFE_WARNING)
        print(UNSAFE_WARNING, file=sys.stderr)
        REGISTRY.register(_UnsafeCollector())
    executor = Executor(backend, workers=settings.workers or None, queue=settings.queue)
    # On a graceful stop, end the warm sandboxes and reap them here: left to --die-with-parent, their
    # pid-1 interpreters would be re-parented to whichever ancestor reaps orphans, as zombies.
    atexit.register(executor.close)
    return bindings(executor)


if __name__ == "__main__":
    run_service("sandbox", build, SandboxSettings)

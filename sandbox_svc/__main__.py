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

from atgrpo.rpc.main import base_parser, run_service
from sandbox_svc.backends import BACKENDS, BackendUnavailable, make_backend
from sandbox_svc.executor import Executor
from sandbox_svc.policy import Policy
from sandbox_svc.server import bindings

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


def parser():
    ap = base_parser("sandbox")
    ap.add_argument("--backend", choices=BACKENDS, default=os.environ.get("ATGRPO_SANDBOX_BACKEND", "bwrap"))
    ap.add_argument("--unsafe-no-isolation", action="store_true",
                    help="allow --backend subprocess, which runs code without any isolation")
    ap.add_argument("--workers", type=int, default=0, help="programs run at once (0 = the cores)")
    ap.add_argument("--queue", type=int, default=-1, help="requests that may wait (-1 = 4 x workers)")
    ap.add_argument("--uid-base", type=int, default=60000,
                    help="as root, worker slot i runs programs as host uid uid_base + i")
    ap.add_argument("--docker-image", default=None, help="image for --backend docker (default: built locally)")
    return ap


def build(args) -> list:
    try:
        backend = make_backend(args.backend, Policy(), unsafe_no_isolation=args.unsafe_no_isolation,
                               uid_base=args.uid_base, docker_image=args.docker_image)
    except BackendUnavailable as err:
        sys.exit(f"sandbox: cannot start: {err}")
    if not backend.isolated:
        log.warning(UNSAFE_WARNING)
        print(UNSAFE_WARNING, file=sys.stderr)
        REGISTRY.register(_UnsafeCollector())
    executor = Executor(backend, workers=args.workers or None, queue=None if args.queue < 0 else args.queue)
    # On a graceful stop, end the warm sandboxes and reap them here: left to --die-with-parent, their
    # pid-1 interpreters would be re-parented to whichever ancestor reaps orphans, as zombies.
    atexit.register(executor.close)
    return bindings(executor)


if __name__ == "__main__":
    run_service("sandbox", build, parser=parser())

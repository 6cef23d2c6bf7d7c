"""The sandbox's Prometheus metrics (names as DESIGN.md §4: atgrpo_sandbox_<what>_<unit>).

Defined here, once; executor.py updates them. Capacity is exported next to the queue depth so an
alert can say "the queue is 90% full" without knowing the --workers/--queue flags.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EXEC_SECONDS = Histogram(
    "atgrpo_sandbox_exec_seconds",
    "Wall time of one execution, by verdict.",
    ["backend", "verdict"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
QUEUE_DEPTH = Gauge(
    "atgrpo_sandbox_queue_depth", "Requests admitted and waiting for a worker slot."
)
RUNNING = Gauge("atgrpo_sandbox_running", "Executions running now.")
REJECTED = Counter("atgrpo_sandbox_rejected_total", "Requests refused because the queue was full.")
WORKERS = Gauge("atgrpo_sandbox_workers", "Worker slots: programs that may run at once.")
QUEUE_CAPACITY = Gauge(
    "atgrpo_sandbox_queue_capacity",
    "Requests that may wait for a slot before new ones are refused.",
)


def set_capacity(workers: int, queue: int) -> None:
    WORKERS.set(workers)
    QUEUE_CAPACITY.set(queue)

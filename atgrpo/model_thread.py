"""One thread for a process's work on a model, and handing freed memory back to the system.

Why one thread: glibc's malloc gives each thread an arena of its own and keeps what is freed in
it for that thread's next allocations. `asyncio.to_thread` rotates over the default executor's
threads, so each update's activations (~2 MB a position for SmolLM2 in float32, ~9 GB an
update) were freed into a different arena in turn and stayed there. Measured on SmolLM2, three
updates of 48 samples: RSS 9.0, 10.9, 19.1 GB, then the kernel's OOM kill at 24 GB; the same
updates on one thread held at 10.8 GB.

Why trim: freed memory a process keeps is memory another service on the machine cannot have.
`malloc_trim(0)` after an update hands it back: SmolLM2's trainer went from 10.8 GB to 2.6 GB
(its weights, gradients and Adam state) in 0.7-0.9 s, so the rollout's generation, which runs
while the trainer waits, has that memory."""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import ctypes.util
import functools
import resource
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ModelThread:
    """An executor of one thread: `await thread.run(fn, *args)` is `asyncio.to_thread(fn, *args)`
    (the caller's context variables go along) but always on the same thread, in call order."""

    def __init__(self, name: str, initializer: Callable[[], Any] | None = None):
        # initializer: run once on the thread before any call (per-thread state, e.g. the CUDA
        # device)
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=initializer
        )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@functools.cache
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None  # glibc; musl has none
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Hand the pages malloc holds free back to the system (glibc's malloc_trim). False where
    the C library cannot (not glibc): nothing to do there."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def rss_bytes() -> int:
    """This process's resident memory now (Linux; 0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def peak_rss_bytes() -> int:
    """The most resident memory this process has held since it started (the kernel updates its
    high-water mark lazily: now's may be a few pages above it)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # bytes on macOS, KiB on Linux
    return max(rss_bytes(), peak if sys.platform == "darwin" else peak * 1024)

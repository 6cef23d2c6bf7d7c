"""atgrpo.model_thread: a model's work on one thread, and freed memory handed back to the system.

Both are there because of a measured OOM kill: SmolLM2's trainer updating on asyncio.to_thread's
rotating threads grew 9.0 -> 10.9 -> 19.1 GB over three updates (freed activations kept in a new
malloc arena each time), where one thread held at 10.8 GB, and 2.6 GB after malloc_trim."""

import asyncio
import contextvars
import json
import subprocess
import sys
import threading

import pytest

from atgrpo.model_thread import ModelThread

CALLER = contextvars.ContextVar("caller")


def test_every_call_runs_on_one_thread_in_call_order_with_the_callers_context():
    seen = []

    def work(i):
        seen.append((i, threading.get_ident(), CALLER.get()))
        return i * 2

    async def go():
        thread = ModelThread("test")
        CALLER.set("the caller's")
        try:
            # gathered at once: asyncio.to_thread would spread these over its executor's threads
            return await asyncio.gather(*(thread.run(work, i) for i in range(12)))
        finally:
            thread.close()

    assert asyncio.run(go()) == [2 * i for i in range(12)]
    assert [i for i, _, _ in seen] == list(range(12))
    idents = {ident for _, ident, _ in seen}
    assert len(idents) == 1 and threading.get_ident() not in idents
    assert {value for _, _, value in seen} == {"the caller's"}


def test_an_error_in_the_thread_reaches_the_caller_and_the_thread_keeps_serving():
    def fail():
        raise ValueError("bad input")

    async def go():
        thread = ModelThread("test")
        with pytest.raises(ValueError, match="bad input"):
            await thread.run(fail)
        return await thread.run(sum, [1, 2, 3])

    assert asyncio.run(go()) == 6


# 400 MB in 100 kB blocks (below malloc's mmap threshold: on the heap), then one block on top of
# them, so that freeing the rest cannot shrink the heap by itself.
_HEAP = """
import json
from atgrpo.model_thread import release_freed_memory, rss_bytes
blocks = [b"x" * 100_000 for _ in range(4000)]
top = b"y" * 100_000
del blocks
freed = rss_bytes()
released = release_freed_memory()
print(json.dumps({"freed": freed, "after": rss_bytes(), "released": released}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's (Linux)")
def test_release_hands_freed_heap_pages_back_to_the_system():
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", _HEAP], capture_output=True, text=True, check=True
        ).stdout
    )
    assert out["released"] is True
    assert out["freed"] - out["after"] > 300e6, out  # freed but held, until released


# 200 MB touched then freed: resident memory rises by it while held, and the peak keeps it after.
_PEAK = """
import json
from atgrpo.model_thread import peak_rss_bytes, rss_bytes
before = rss_bytes()
block = bytearray(200_000_000)
block[::4096] = b"z" * len(block[::4096])    # touch every page: untouched pages are not resident
held = rss_bytes()
del block
print(json.dumps({"before": before, "held": held, "after": rss_bytes(), "peak": peak_rss_bytes()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_resident_memory_and_its_peak_follow_what_the_process_touches():
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", _PEAK], capture_output=True, text=True, check=True
        ).stdout
    )
    assert out["held"] - out["before"] >= 190e6, out
    assert out["peak"] >= out["before"] + 190e6, out  # the high-water mark outlives the block
    assert out["held"] - out["after"] >= 150e6, out  # a 200 MB block is mmapped: freed at once

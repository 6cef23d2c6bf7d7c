"""glibc malloc set for a process that allocates and frees tensors of megabytes many times a second.

Out of the box glibc serves each large allocation with its own mmap (the threshold adapts up to
32 MB) and hands freed memory at the top of the heap back to the kernel past 128 KB. A decode step
allocates and frees tensors of several MB (SmolLM2's 49,152-token logits at 64 rows are 12.6 MB,
each float copy of them another), so every step faulted its pages in afresh: measured on this
project's AMD EPYC (one torch thread, SmolLM2-135M in bf16, 16 prompts x K 4 x 64 tokens), 2.76
million minor faults and 4.6 s of kernel time against 143,000 and 0.2 s with the settings below;
generation 12.6 s -> 11.3 s, the token draw 32 ms -> 7 ms a step, and the trainer's bf16 update of
a mixed step 17.7 s -> 16.2 s (bench/real_speed.py; docs/results.md). So the services that run a
model (rollout, trainer) keep freed memory for reuse: the heap is not trimmed, and allocations up
to 32 MB (glibc's most) come from it. The process's resident memory stays at its peak instead of
falling back between steps, which is what a pod's memory limit is sized for anyway.

An operator's own setting wins: nothing changes where a MALLOC_* variable or GLIBC_TUNABLES is
set, or with ATGRPO_MALLOC=default. On a C library without mallopt (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2**31 - 1  # mallopt's largest (a C int): freed memory stays for the next step
OPT_OUT = ("ATGRPO_MALLOC", "default")


def operator_set() -> bool:
    """Whether the environment already says how malloc should behave (or opts out of this)."""
    return (
        os.environ.get(OPT_OUT[0]) == OPT_OUT[1]
        or "GLIBC_TUNABLES" in os.environ
        or any(k.startswith("MALLOC_") for k in os.environ)
    )


def keep_freed_memory() -> bool:
    """Set this process's malloc as the module says. Returns whether it did (False: an operator's
    setting, or no glibc)."""
    if operator_set():
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success. Both or neither: a trimmed heap with a raised mmap threshold
    # would fault in more, not less.
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return False
    return mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1

"""The benchmarks' shared record: each bench prints its own table and, under `make bench`, also
appends its headline ratios here so bench/all.py can print one table of every ratio.

Smoke mode (ATGRPO_BENCH_SMOKE=1, what tests/bench runs under `make test`): every bench runs at
the smallest size that still takes the same code path and records the same ratios, so a change
that breaks a benchmark fails the tests instead of the next `make bench`."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
from typing import Any

SMOKE = os.environ.get("ATGRPO_BENCH_SMOKE", "") not in ("", "0")

# Host uids 63000-64999 for the sandboxes the benches start themselves, in ranges of 250 (the
# worker slots of one sandbox). A bwrap sandbox runs slot i as uid base + i and, when it closes
# or discards a slot, kills every process of that uid on the host: on the default base (60000,
# every sandbox server's, `atgrpo train`'s and the tests') a bench killed the warm sandboxes of a
# server running beside it, and theirs killed its own ("sandbox broken ... starting a fresh one").
_UID_RANGES = range(63000, 65000, 250)
_held: dict[int, Any] = {}     # the range this process holds: base -> its lock file


def parse_args(ap: argparse.ArgumentParser, smoke: dict[str, Any]) -> argparse.Namespace:
    """`ap`'s arguments, with `smoke`'s values as the defaults in smoke mode (flags still win)."""
    if SMOKE:
        ap.set_defaults(**smoke)
    return ap.parse_args()


def sandbox_uid_base(slots: int) -> int:
    """A base uid no other sandbox on this host uses, for this process's sandboxes (one at a time):
    held by a lock file until the process exits, so two benches running at once (`make bench`
    beside `make test`) get different ones."""
    if slots > _UID_RANGES.step:
        raise SystemExit(f"{slots} sandbox workers: a bench's uid range holds {_UID_RANGES.step}")
    if _held:
        return next(iter(_held))
    if os.geteuid() != 0:
        return _UID_RANGES.start      # not root: the sandbox runs everything as this user anyway
    for base in _UID_RANGES:
        lock = open(f"/tmp/atgrpo-bench-uids-{base}.lock", "w")   # held until the process exits
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _held[base] = lock
        return base
    raise SystemExit(f"every bench uid range ({_UID_RANGES.start}-{_UID_RANGES.stop - 1}) is in use")


def record(bench: str, what: str, ratio: float, detail: str = "") -> None:
    """One headline figure: `ratio` of atgrpo's path against the baseline measured in the same run."""
    out = os.environ.get("ATGRPO_BENCH_OUT")
    if not out:
        return
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"bench": bench, "what": what, "ratio": ratio, "detail": detail}) + "\n")

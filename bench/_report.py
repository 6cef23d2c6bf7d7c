"""The benchmarks' shared record: each bench prints its own table and, under `make bench`, also
appends its headline ratios here so bench/all.py can print one table of every ratio."""

from __future__ import annotations

import json
import os


def record(bench: str, what: str, ratio: float, detail: str = "") -> None:
    """One headline figure: `ratio` of atgrpo's path against the baseline measured in the same run."""
    out = os.environ.get("ATGRPO_BENCH_OUT")
    if not out:
        return
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"bench": bench, "what": what, "ratio": ratio, "detail": detail}) + "\n")

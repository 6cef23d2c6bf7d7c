"""The benchmarks' shared record: each bench prints its own table and, under `make bench`, also
appends its headline ratios here so bench/all.py can print one table of every ratio.

Smoke mode (ATGRPO_BENCH_SMOKE=1, what tests/bench runs under `make test`): every bench runs at
the smallest size that still takes the same code path and records the same ratios, so a change
that breaks a benchmark fails the tests instead of the next `make bench`."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

SMOKE = os.environ.get("ATGRPO_BENCH_SMOKE", "") not in ("", "0")

# The uids of this process's sandbox (one at a time), claimed like every sandbox server's
# (sandbox_svc/uids.py) so that a bench beside a run or another bench never shares one.
_held: list = []


def parse_args(ap: argparse.ArgumentParser, smoke: dict[str, Any]) -> argparse.Namespace:
    """`ap`'s arguments, with `smoke`'s values as the defaults in smoke mode (flags still win)."""
    if SMOKE:
        ap.set_defaults(**smoke)
    return ap.parse_args()


def choices(ap: argparse.ArgumentParser, given: str, known, name: str) -> list[str]:
    """`given`, comma-separated, as a list of names each in `known`; the parser's error naming
    the choices otherwise."""
    got = given.split(",")
    if unknown := [g for g in got if g not in known]:
        ap.error(f"unknown {name}(s) {unknown}; choose from {list(known)}")
    return got


def sandbox_uid_base(slots: int) -> int:
    """The first of `slots` host uids no other sandbox on this host holds, until the process
    exits."""
    if not _held:
        if os.geteuid() != 0:
            return 60000  # not root: the sandbox runs everything as this user anyway
        from sandbox_svc.uids import claim

        _held.append(claim(slots))
    return _held[0].base


def record(bench: str, what: str, ratio: float, detail: str = "") -> None:
    """One headline figure: `ratio` of atgrpo's path against the baseline measured in the same
    run."""
    out = os.environ.get("ATGRPO_BENCH_OUT")
    if not out:
        return
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"bench": bench, "what": what, "ratio": ratio, "detail": detail}) + "\n")


def plot_panels(
    panels: dict[str, list[tuple[str, list[float], list[float]]]], path, xlabel: str, ylabel: str
) -> None:
    """One panel a title, each a curve a (label, xs, ys), success on a 0-1 axis, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels.items(), strict=True):
        for label, xs, ys in curves:
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel, ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)

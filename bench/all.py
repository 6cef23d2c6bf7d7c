"""`make bench`: run every benchmark in bench/ and print one table of their headline ratios.

Each benchmark prints its own table as it goes; the ratios are against a baseline measured in
the same run (bench/_report.py), so the table reads the same on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# baseline.py, async_learning.py, ablations.py, real_learning.py and parallel_credit.py are tables
# of success rates, not ratios, and take minutes to tens of minutes: run them alone.
SKIP = (
    "all.py",
    "baseline.py",
    "async_learning.py",
    "ablations.py",
    "real_learning.py",
    "paper_table.py",
    "parallel_credit.py",
    "program_curve.py",  # a report of two runs' curves, not a benchmark
)


def main() -> int:
    benches = sorted(
        p for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name not in SKIP
    )
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ratios.jsonl"
        env = {**os.environ, "ATGRPO_BENCH_OUT": str(out), "PYTHONPATH": str(HERE.parent)}
        for bench in benches:
            print(f"== {bench.name}", flush=True)
            if subprocess.run([sys.executable, str(bench)], env=env).returncode != 0:
                failed.append(bench.name)
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    print("\n== every ratio (atgrpo / baseline measured in the same run)")
    print(f"{'bench':<10} {'what':<60} {'ratio':>7}  detail")
    for r in rows:
        print(f"{r['bench']:<10} {r['what']:<60} {r['ratio']:6.2f}x  {r['detail']}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Every script in bench/ at its smoke size (ATGRPO_BENCH_SMOKE=1, bench/_report.py): it runs the
real services and both sides of its comparison, exits 0 and records finite positive ratios, so
a change that breaks a benchmark fails here and not at the next `make bench`. A new script is
picked up by the glob; it needs a smoke size (bench/_report.parse_args) to stay quick."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.all import SKIP
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

# What `make bench` runs (baseline.py, a table and no ratio, has its own test: test_baseline.py).
BENCHES = sorted(
    p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_") and p.name not in SKIP
)


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.stem)
def test_bench_runs_at_smoke_size(bench, tmp_path, subprocess_env):
    out = tmp_path / "ratios.jsonl"
    env = {**subprocess_env, "ATGRPO_BENCH_SMOKE": "1", "ATGRPO_BENCH_OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, str(bench)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    log = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, log
    # A warm sandbox that broke means something killed its processes (e.g. another sandbox on
    # the same uids): the bench would measure restarts.
    assert "sandbox broken" not in proc.stderr, log
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert rows, f"{bench.name} recorded no ratio\n{log}"
    for r in rows:
        assert r["bench"] == bench.stem and r["what"], r
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0, r

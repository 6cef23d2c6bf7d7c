"""bench/baseline.py on one env (toy), two tasks, the tiny model: it starts the services, evaluates
and writes a table row and JSON that agree. The real table (SmolLM2, every env) takes tens of
minutes; this keeps the script from rotting between regenerations of docs/environments.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_baseline_toy_row(tiny_model, tmp_path, subprocess_env):
    out = tmp_path / "baseline.md"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "baseline.py"),
            "--envs",
            "toy",
            "--tasks",
            "2",
            "--model",
            tiny_model,
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ],
        env=subprocess_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    data = json.loads(out.with_suffix(".json").read_text())
    [row] = data["rows"]
    assert "error" not in row, row
    assert row["env"] == "toy" and row["level"] == "L1" and row["agents"] == ["speaker", "listener"]
    assert row["tasks"] == 2 and row["failed_episodes"] == 0
    assert 0.0 <= row["success"] <= 1.0 and 1.0 <= row["turns_mean"] <= 2.0
    assert row["wall_s"] > 0 and row["s_per_episode"] == pytest.approx(row["wall_s"] / 2)
    table = out.read_text()
    assert f"| toy | L1: speaker + listener | 2 | 16 | {row['success']:.3f} |" in table, table
    assert table in proc.stdout

"""bench/program_curve.py: the built-in env's and the agent program's evaluations side by side."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(path: Path, evals: list[tuple[int, float]], seconds: list[float]) -> Path:
    path.mkdir()
    lines = [{"kind": "eval", "step": s, "success_rate": x} for s, x in evals]
    lines += [{"kind": "step", "step": i + 1, "step_seconds": t} for i, t in enumerate(seconds)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_the_table_has_the_steps_both_runs_evaluated_and_each_runs_median_step(tmp_path):
    builtin = _run(tmp_path / "b", [(0, 0.125), (4, 0.5), (8, 0.9375)], [10.0, 30.0, 20.0])
    program = _run(tmp_path / "p", [(0, 0.1), (4, 0.25)], [40.0, 50.0])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/program_curve.py"), "--program", str(program)]
        + ["--builtin", str(builtin), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (out / "program_curve.md").read_text().splitlines() == [
        "| env | step 0 | step 4 | s / step (median) |",
        "|---|---|---|---|",
        "| built-in reasoning_gym (b) | 0.125 | 0.500 | 20.0 |",
        "| agent program (p) | 0.100 | 0.250 | 50.0 |",
    ]
    assert "| agent program (p) | 0.100 | 0.250 | 50.0 |" in proc.stdout
    kept = json.loads((out / "program_curve.json").read_text())
    assert kept["built-in reasoning_gym (b)"]["evals"][2] == {"step": 8, "success": 0.9375}
    assert (out / "program_curve.png").stat().st_size > 5_000

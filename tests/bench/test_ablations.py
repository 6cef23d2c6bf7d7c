"""bench/ablations.py at its smoke size (one seed, two steps, 8 eval tasks, the code task, AT-GRPO
and L2): it trains both variants through the real services, evaluates their last checkpoints
greedily, and writes a table, curves and JSON that agree. The real comparison (3 seeds, 80 steps,
every variant: 16 min) keeps docs/design.md's table; this keeps the script from rotting meanwhile.
It starts from the plain tiny model, not the one taught the code's pairs (the bench's own start,
28 s more of setup): what each variant learns is not what this checks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_ablations_smoke(tiny_model, tmp_path, subprocess_env):
    env = {**subprocess_env, "ATGRPO_BENCH_SMOKE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "ablations.py"),
            "--model",
            tiny_model,
            "--out",
            str(tmp_path),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    data = json.loads((tmp_path / "ablations.json").read_text())
    assert [(r["task"], r["variant"]) for r in data["rows"]] == [
        ("code", "at-grpo"),
        ("code", "L2"),
    ]
    for row in data["rows"]:
        assert row["steps"] == [0, 1, 2] and len(row["success"]) == 3
        assert all(0.0 <= s <= 1.0 for s in row["success"]) and 0.0 <= row["greedy"] <= 1.0
        assert 0.0 <= row["speaker_return"] <= 0.6  # the speaker's step pays local reward only
        # Two agents, K = 8, 8 tasks, one turn: 128 samples a step, each 1 to 4 tokens.
        assert row["samples_per_step"] == 128 and 128 <= row["tokens_per_step"] <= 512
    at, l2 = data["rows"]
    # L1 trains the whole tiny model; L2 two rank-16 adapters on q, k, v, o of its 2 layers of width
    # 64 (k and v 32 wide): 2 x 16 x 2 x ((64+64) + (64+32) + (64+32) + (64+64)) = 28,672.
    assert (at["trainable"], l2["trainable"]) == (172_608, 28_672)
    table = (tmp_path / "ablations.md").read_text()
    assert f"| code | L2 | {l2['success'][0]:.2f} |" in table and table.strip() in proc.stdout
    assert (tmp_path / "ablations.png").stat().st_size > 10_000

"""scripts/gpu_check.py, the prepared GPU check, as a CPU smoke run: the same code paths at a small
size, so the script a GPU session runs once is known to work before a GPU is lent."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_on_cpu_and_reports_both_parts(tmp_path, subprocess_env):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--size", "small",
                           "--micro-batch-tokens", "512", "--sample-tokens", "64", "--gen-tokens", "8",
                           "--out", str(out)],
                          env=subprocess_env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    trainer, services = report["trainer"], report["services"]
    assert trainer["samples"] == 8 and trainer["micro_batch_tokens"] == 512 and trainer["tokens_per_s"] > 0
    assert trainer["peak_bytes"] > 0 and trainer["plan_bytes"] == sum(trainer["plan_components"].values())
    assert trainer["loss"] == trainer["loss"]                      # a number, not NaN
    assert services["exit_code"] == 0 and services["steps"] == 3 and services["staleness_max"] == [0, 0, 0]
    push = report["push"]
    assert push["bytes_sent"] >= push["model_bytes"] > 0 and push["push_gb_per_s"] > 0
    assert push["host_peak_growth_bytes"] > 0 and push["generate_tokens_per_s"] > 0   # small: fixed costs dominate

"""Training end to end as a user runs it: `atgrpo train`, `eval` and `plot` as commands (what they
print and leave in the run directory), and SIGTERM to `atgrpo train` stopping the local services
it started."""

from __future__ import annotations

import json

import pytest

from tests.e2e.toy_runs import toy_config

pytestmark = pytest.mark.slow


def test_cli_train_eval_and_plot(tiny_model, tmp_path, subprocess_env):
    """`atgrpo train` as a user runs it: a line per step and evaluation, and a run directory with
    the config, metrics, TensorBoard events, checkpoints and the curves; then `eval` and `plot`."""
    import subprocess
    import sys

    import yaml

    data = toy_config(tmp_path / "ignored", tiny_model, "L1", steps=5, eval_every_steps=2)
    cfg_path = tmp_path / "toy.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"

    def atgrpo(*args):
        return subprocess.run(
            [sys.executable, "-m", "atgrpo.cli", *args],
            env=subprocess_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    out = atgrpo("train", str(cfg_path), "--steps", "2", "--run-dir", str(run_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "step    2/2" in out.stdout
        and "eval @ step    2" in out.stdout
        and "run finished" in out.stdout
    )
    assert {"config.yaml", "metrics.jsonl", "state.json", "curves.png", "tb", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()
    }
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    # --steps applied; no dead ports kept
    assert saved["run"]["steps"] == 2 and "services" not in saved
    assert next((run_dir / "tb").glob("events.out.tfevents.*")).stat().st_size > 0
    assert (run_dir / "checkpoints" / "step-000002" / "a" / "model" / "config.json").exists()

    ev = atgrpo("eval", str(run_dir / "config.yaml"), "--checkpoint", str(run_dir), "--json")
    assert ev.returncode == 0, ev.stdout + ev.stderr
    result = json.loads(ev.stdout[ev.stdout.index("{") :])
    assert result["kind"] == "eval" and result["step"] == 2 and result["episodes"] == 4
    assert 0.0 <= result["success_rate"] <= 1.0 and set(result["agents"]) == {"speaker", "listener"}
    assert (run_dir / "evals" / "step-000002" / "services" / "logs" / "router.log").exists()
    # a checkpoint holds only weights
    assert not (run_dir / "checkpoints" / "step-000002" / "eval").exists()

    (run_dir / "curves.png").unlink()
    assert (
        atgrpo("plot", str(run_dir)).returncode == 0 and (run_dir / "curves.png").stat().st_size > 0
    )
    missing = atgrpo("train", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "file not found" in missing.stderr


def test_sigterm_to_atgrpo_train_stops_its_local_services(tiny_model, tmp_path, subprocess_env):
    import signal
    import subprocess
    import sys
    import time

    import psutil
    import yaml

    from atgrpo.cli import launcher

    cfg_path = tmp_path / "toy.yaml"
    cfg_path.write_text(yaml.safe_dump(toy_config(tmp_path / "run", tiny_model, "L1", steps=1000)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "atgrpo.cli", "train", str(cfg_path)],
        env=subprocess_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
        assert proc.poll() is None
        time.sleep(0.5)
    services = launcher.read_state(tmp_path / "run" / "services")
    assert len(services) == 5 and all(launcher.is_ours(s) for s in services)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(
        [psutil.Process(s.pid) for s in services if launcher.is_ours(s)], timeout=15
    )
    assert not alive

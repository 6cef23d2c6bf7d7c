"""`atgrpo eval` on the HumanEval example (examples/code_humaneval_L1_tiny.yaml) as a user runs it,
shrunk to a few problems and tokens: without --checkpoint it evaluates the starting weights
(each pool's model_path), running HumanEval episodes through every service to a result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code_humaneval_L1_tiny.yaml"


def test_atgrpo_eval_on_the_humaneval_example(tiny_model, tmp_path, subprocess_env):
    data = yaml.safe_load(EXAMPLE.read_text())
    assert (
        data["env"]["options"]["eval"] == {"dataset": "humaneval"}
        and data["run"]["eval_tasks"] == 164
    )
    # Shrunk: a 96-token answer from the tiny model is not worth the minutes on 2 cores.
    data["run"].update(
        tasks_per_step=1, eval_every_steps=0, eval_tasks=3, run_dir=str(tmp_path / "run")
    )
    data["env"]["max_turns"] = data["env"]["options"]["max_turns"] = 1
    data["pools"]["shared"]["model_path"] = tiny_model
    data["algorithm"].update(k=2, mini_batch_size=4)
    for agent in data["agents"].values():
        agent["train_sampling"]["max_tokens"] = agent["eval_sampling"]["max_tokens"] = 8
    cfg = tmp_path / "humaneval.yaml"
    cfg.write_text(yaml.safe_dump(data))

    def atgrpo(*args):
        return subprocess.run(
            [sys.executable, "-m", "atgrpo.cli", *args],
            env=subprocess_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )

    ev = atgrpo("eval", str(cfg), "--json")
    assert ev.returncode == 0, ev.stdout + ev.stderr
    result = json.loads(ev.stdout[ev.stdout.index("{") :])
    assert (result["kind"], result["step"], result["episodes"]) == ("eval", 0, 3)
    assert result["success_rate"] == 0.0 and set(result["agents"]) == {"coder", "tester"}
    # Its own run directory beside the (absent) training run's; no checkpoint was written or needed.
    assert (tmp_path / "run" / "evals" / "start" / "metrics.jsonl").is_file()
    assert not (tmp_path / "run" / "checkpoints").exists()

"""The `atgrpo` command's offline subcommands, called as a user would (in-process main())."""

from pathlib import Path

import pytest
import yaml

from atgrpo.cli import main
from atgrpo.models import model_fingerprint
from tests.conftest import ROOT

EXAMPLES = ROOT / "examples"


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("atgrpo 0.")


def test_config_check_accepts_every_example(capsys):
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert examples
    for path in examples:
        assert main(["config", "check", str(path)]) == 0, capsys.readouterr().err
        assert "ok (L" in capsys.readouterr().out


def test_config_check_lists_every_problem_with_its_fix(tmp_path, capsys):
    cfg = yaml.safe_load((EXAMPLES / "plan_path_L1_tiny.yaml").read_text())
    cfg["algorithm"]["k"] = 0
    cfg["agents"]["plan"]["pool"] = "missing"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "algorithm.k" in err and "agents.plan.pool" in err and "shared" in err


def test_model_tiny_writes_a_loadable_directory_and_prints_it(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["model", "tiny", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    again = tmp_path / "again"
    main(["model", "tiny", "--out", str(again)])
    assert model_fingerprint(out) == model_fingerprint(again)


def test_examples_cover_every_builtin_env_at_every_level():
    """examples/<env>[_<dataset>]_<level>_<tiny|smollm2|gpu>.yaml: the env and level the file names
    are the config's, tiny and smollm2 run on CPU with the hf engine, gpu with vllm on cuda."""
    from atgrpo.config import load_config
    from env_svc.envs import BUILTIN

    found = set()
    for path in EXAMPLES.glob("*.yaml"):
        named, level, variant = path.stem.rsplit("_", 2)
        cfg = load_config(path)
        env = cfg.env.name
        assert named == env or named.startswith(f"{env}_"), path.name  # code_humaneval: env code
        assert cfg.level == level, path.name
        pools = cfg.pools.values()
        if variant in ("tiny", "smollm2"):  # smollm2: the real small model, on CPU too
            assert all((p.engine, p.device) == ("hf", "cpu") for p in pools), path.name
        else:
            assert variant == "gpu" and all(
                (p.engine, p.device) == ("vllm", "cuda") for p in pools
            ), path.name
        found.add((env, level, variant))
    want = {(e, lv, v) for e in BUILTIN for lv in ("L0", "L1", "L2", "L3") for v in ("tiny", "gpu")}
    assert want <= found, sorted(want - found)


WARM_MODELS = {"plan_path": ".atgrpo/models/smollm2-plan-path"}


def test_the_smollm2_examples_are_the_learning_bench_s_at_grpo_runs():
    """examples/reasoning_gym_<task>_L1_smollm2.yaml trains what bench/real_learning.py measured
    (docs/real_learning/): the bench's AT-GRPO config of that task, but for where the run goes."""
    import sys

    sys.path.insert(0, str(ROOT))
    from bench._learning_config import run_config
    from bench._learning_variants import TASKS

    # a task that differs from its env's only by a smaller warm start (plan_path_w60) is the same
    # example with that model
    for task in (t for t in TASKS if not TASKS[t].warm_episodes):
        env = TASKS[task].env
        name = f"{task}_L1_smollm2.yaml" if env == task else f"{env}_{task}_L1_smollm2.yaml"
        # plan_path's example starts from its warm start (its header says how to build it)
        model = WARM_MODELS.get(task, ".atgrpo/models/smollm2")
        example = yaml.safe_load((EXAMPLES / name).read_text())
        bench = run_config(
            task,
            "at-grpo",
            model,
            ROOT / "x",
            steps=40,
            eval_every=10,
            eval_tasks=64,
        )
        for data in (example, bench):
            data["run"].pop("name")
            data["run"].pop("run_dir", None)
        assert example == bench, task
    # arithmetic_fast is issue 55's tuned run (docs/results.md, "Time to accuracy, tuned")
    from bench._learning_config import Knobs

    tuned = Knobs(lr=3e-5, max_staleness=1, stop_at_fence=True, stop_at_paragraph=True)
    bench = run_config(
        "arithmetic", "at-grpo", ".atgrpo/models/smollm2", ROOT / "x", 40, 4, 64, knobs=tuned
    )
    fast = yaml.safe_load((EXAMPLES / "reasoning_gym_arithmetic_fast_L1_smollm2.yaml").read_text())
    for data in (fast, bench):
        data["run"].pop("name")
        data["run"].pop("run_dir", None)
    assert fast == bench


def test_the_cli_parses_the_config_once_and_edits_it_after(monkeypatch, tmp_path):
    """Overrides, absolute paths and the local services' addresses edit the parsed config; none
    goes back through YAML and the parser (each edit equals what a parse of the edited dict
    gives)."""
    from atgrpo import config
    from atgrpo.cli import runner
    from atgrpo.cli.launcher import LocalService

    cfg = config.load_config(EXAMPLES / "plan_path_L1_tiny.yaml")
    expected_overrides = config.parse_config(
        {**cfg.to_dict(), "run": {**cfg.to_dict()["run"], "steps": 3}}
    )
    names = ["env", "sandbox", "router", "rollout-shared-0", "trainer-shared"]
    started = [
        LocalService(n, n, 1, 0.0, f"127.0.0.1:{5000 + i}", "", "") for i, n in enumerate(names)
    ]

    def no_parse(*_a, **_k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(config, "parse_config", no_parse)
    monkeypatch.setattr(runner, "parse_config", no_parse)
    assert cfg.with_overrides(steps=3) == expected_overrides
    with pytest.raises(config.ConfigError, match="run.steps"):
        cfg.with_overrides(steps=0)  # still checked by the file's rules
    resolved = runner.resolve_paths(cfg)
    assert (
        Path(resolved.run.run_dir).is_absolute()
        and Path(resolved.pools["shared"].model_path).is_absolute()
    )
    connected = runner.with_services(resolved, started)
    assert not connected.local_mode and connected.services.rollout == {
        "shared": ("127.0.0.1:5003",)
    }
    assert (
        connected.services.trainer == {"shared": "127.0.0.1:5004"}
        and connected.pools == resolved.pools
    )

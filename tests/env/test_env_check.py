"""`atgrpo env check`: each broken environment is refused naming the rule it breaks; correct ones
(the built-ins among them) pass; the command exits 0 / 1 / 2 and says why."""

import json

import pytest
import yaml

from atgrpo.cli import main
from atgrpo.sdk.check import check_env, check_env_async
from atgrpo.sdk.check_report import RULES
from tests.env import broken_envs as broken
from tests.env.sdk_envs import CarelessEnv, CounterEnv


@pytest.mark.parametrize(
    "cls, options, rule",
    [
        (broken.UnseededReset, {}, "reset-deterministic"),
        (broken.NoisyStep, {}, "step-deterministic"),
        (broken.ClassLog, {}, "fork-independent"),
        (broken.ForkIsSelf, {}, "fork-independent"),
        (broken.NanReward, {}, "rewards-finite"),
        (CarelessEnv, {"mode": "inf_reward"}, "rewards-finite"),
        (broken.RaisesOnText, {}, "never-raises"),
        (broken.PickResolvesEarly, {}, "parallel-resolves-last"),
        (CarelessEnv, {"mode": "observe_str"}, "observe"),
        (CarelessEnv, {"mode": "no_spec"}, "builds"),
        (CarelessEnv, {"mode": "init_raises"}, "builds"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_a_broken_env_is_refused_naming_the_rule(cls, options, rule):
    report = check_env(cls, options)
    assert not report.ok
    assert rule in {f.rule for f in report.failures}, report.render()
    assert f"FAIL {rule}: " in report.render()


def test_every_finding_is_a_known_rule_with_its_fix():
    report = check_env(broken.ClassLog)
    (found,) = report.failures
    assert found.rule in RULES and "fork() must copy everything a step changes" in found.message


@pytest.mark.parametrize(
    "cls",
    [CounterEnv, broken.PickAtOnce, broken.OnlyWhoseTurn, broken.NamedPuzzles],
    ids=["sequential", "parallel", "observe_only_whose_turn", "listed_task_ids_only"],
)
def test_a_correct_env_keeps_every_rule(cls):
    report = check_env(cls)
    assert report.ok and report.findings == [], report.render()
    assert report.steps > 20 and set(report.timings_ms) == {"reset", "observe", "step", "fork"}


@pytest.mark.parametrize(
    "name, options",
    [
        ("toy", {}),
        ("toy", {"parallel": True}),
        ("plan_path", {}),
        ("sokoban", {"parallel": True}),
        ("sudoku", {}),
    ],
)
def test_the_builtin_envs_pass(name, options):
    report = check_env(name, options)
    assert report.ok, report.render()


@pytest.mark.parametrize(
    "name, options",
    [("math", {}), ("code", {}), ("reasoning_gym", {"dataset": "basic_arithmetic"})],
)
def test_the_builtin_envs_that_run_code_pass_with_a_sandbox(name, options, sandbox):
    import asyncio

    report = asyncio.run(check_env_async(name, options, sandbox=sandbox, tasks=1))
    assert report.ok, report.render()
    assert report.steps >= 4


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["env", "check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_exits_1_on_a_broken_env_and_0_on_a_good_one(capsys):
    code, out, _ = _cli(capsys, "tests.env.broken_envs:PickResolvesEarly")
    assert code == 1 and "FAIL parallel-resolves-last:" in out and "1 of 17 rules broken" in out
    code, out, _ = _cli(capsys, "toy", "--options", '{"parallel": true}', "--json")
    assert code == 0 and json.loads(out) == {"env": "toy", "ok": True, "findings": []}


def test_the_command_reads_the_env_and_its_disagreements_from_a_run_config(tmp_path, capsys):
    data = {
        "run": {"name": "r", "run_dir": str(tmp_path / "run")},
        "env": {
            "name": "pick",
            "path": "tests.env.broken_envs:PickAtOnce",
            "turn_order": ["a", "b"],
            "max_turns": 3,
        },
        "pools": {"shared": {"model_path": str(tmp_path / "model")}},
        "agents": {"a": {"pool": "shared"}, "b": {"pool": "shared"}},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, _ = _cli(capsys, "--config", str(path))
    assert code == 1 and "FAIL config: env.parallel is false, but env 'pick'" in out
    data["env"]["parallel"] = True
    path.write_text(yaml.safe_dump(data))
    assert _cli(capsys, "--config", str(path))[0] == 0


@pytest.mark.parametrize(
    "argv, says",
    [
        (["nope"], "NotFound: no environment named 'nope'"),
        (["no_such.module:Env"], "cannot load environment 'no_such.module:Env'"),
        (["toy", "--options", "{parallel"], "--options is not JSON"),
        ([], "give an env"),
    ],
)
def test_a_wrong_command_line_exits_2_saying_what_to_give(argv, says, capsys):
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and says in err


def test_an_env_that_runs_code_without_a_sandbox_is_told_to_give_one(capsys):
    code, out, _ = _cli(capsys, "math")
    assert code == 1 and "FAIL sandbox: env 'math' runs code" in out and "--sandbox" in out

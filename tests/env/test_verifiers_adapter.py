"""verifiers environments (its classic API) through atgrpo.sdk.verifiers: the mapping pinned on a
game written in verifiers' own form (examples/hubs/verifiers_guess.py), what the adapter refuses,
the conformance check, and a few steps of training on the tiny model taught its answer format."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys

import pytest
import verifiers as vf
import yaml
from datasets import Dataset

from atgrpo.cli.main import main
from atgrpo.sdk import metrics
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from atgrpo.sdk.verifiers import VerifiersEnvironment
from examples.hubs.verifiers_guess import Guess
from tests.env.conftest import two_steps_of


def run(coro):
    return asyncio.run(coro)


def started(env, task="0", split="train"):
    run(env.reset(task, 0, split))
    return env


def test_the_game_is_played_through_the_adapter_and_a_fork_is_independent():
    env = started(Guess({}), "5")
    secret = int(env.state["answer"])
    system, user = env.observe("player")
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user" and "Your guess?" in user["content"]
    fork = env.fork()
    wrong = (secret + 1) % 10
    result = run(env.step("player", f"<guess>{wrong}</guess>"))
    assert (result.team_reward, result.done, result.success) == (0.0, False, False)
    conversation = env.observe("player")
    assert conversation[2] == {"role": "assistant", "content": f"<guess>{wrong}</guess>"}
    assert conversation[3]["content"] == ("higher" if wrong < secret else "lower")  # env_response
    assert len(fork.observe("player")) == 2 and fork.state["trajectory"] == []
    right = run(fork.step("player", f"<guess>{secret}</guess>"))
    # the rubric: 1 for the right guess, 0.2 x the format reward (1: the one answer is formatted)
    assert right.done and right.success and right.team_reward == pytest.approx(1.2)
    assert right.info["stop_condition"] == "guessed"
    assert len(env.state["trajectory"]) == 1  # the fork's step did not reach its parent


def test_the_last_turn_is_scored_when_the_envs_max_turns_stop_it():
    env = started(Guess({"verifiers_kwargs": {"max_turns": 2}}), "1")
    assert env.spec.max_turns == 2  # the verifiers env's own max_turns
    secret = int(env.state["answer"])
    first = run(env.step("player", "no idea"))
    assert (first.team_reward, first.done) == (0.0, False)
    assert "Answer with <guess>D</guess>" in env.observe("player")[-1]["content"]
    last = run(env.step("player", f"<guess>{(secret + 1) % 10}</guess>"))
    assert last.done and not last.success
    assert last.info["stop_condition"] == "max_turns_reached"
    assert last.team_reward == pytest.approx(0.2 * 0.5)  # one of two answers was formatted


def test_tasks_are_the_datasets_rows_and_eval_has_its_own():
    env = Guess({})
    assert env.task_ids("train") == [str(i) for i in range(64)]
    train = [started(Guess({}), str(i)).observe("player")[1]["content"] for i in range(8)]
    held_out = [
        started(Guess({}), str(i), "eval").observe("player")[1]["content"] for i in range(8)
    ]
    assert train != held_out
    with pytest.raises(ValueError, match=r"not a row of the train dataset \(ids are 0\.\.63\)"):
        started(Guess({}), "train-0")


def _rows(n=4):
    return Dataset.from_dict(
        {"question": [f"{i} + {i}?" for i in range(n)], "answer": [str(2 * i) for i in range(n)]}
    )


def exact(completion, answer, **kwargs) -> float:
    return float(vf.Parser().parse_answer(completion).strip() == answer)


class Sums(VerifiersEnvironment):
    name = "sums"
    load = staticmethod(lambda: vf.SingleTurnEnv(dataset=_rows(), rubric=vf.Rubric(funcs=[exact])))


def test_a_single_turn_env_is_one_scored_step():
    env = started(Sums({}), "3")
    assert env.observe("player") == [{"role": "user", "content": "3 + 3?"}]
    assert env.spec.max_turns == 1
    result = run(env.step("player", " 6 "))
    assert (result.team_reward, result.done, result.success) == (1.0, True, True)
    assert run(started(Sums({}), "3").step("player", "7")).team_reward == 0.0


class Raising(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise vf.Error("the game's server went away")


class RaisingGame(VerifiersEnvironment):
    name = "raising"
    load = staticmethod(
        lambda: Raising(dataset=_rows(), rubric=vf.Rubric(funcs=[exact]), max_turns=4)
    )


def test_a_verifiers_error_ends_the_episode_and_it_is_scored_as_verifiers_does():
    result = run(started(RaisingGame({}), "1").step("player", "2"))
    assert result.done and result.team_reward == 1.0
    assert result.info["stop_condition"] == "has_error"


class Careless(vf.MultiTurnEnv):
    """Parses the answer as many hub environments do: int() of whatever the parser found."""

    async def env_response(self, messages, state, **kwargs):
        int(vf.Parser().parse_answer(messages))
        return [vf.UserMessage(content="again")]


class CarelessGame(VerifiersEnvironment):
    name = "careless_game"
    load = staticmethod(
        lambda: Careless(dataset=_rows(), rubric=vf.Rubric(funcs=[exact]), max_turns=4)
    )


def test_an_env_that_raises_on_an_answer_ends_the_episode_as_a_format_failure():
    """verifiers would fail the rollout (no samples: a policy could void its bad episodes); here
    the rubric scores the episode, the step says why, and the host counts a judge error instead of
    failing the run with EnvCodeError."""

    async def go():
        host = EnvHost(Registry({"careless_game": f"{__name__}:CarelessGame"}, discover=False))
        envs = LocalEnvs(host)
        ep, _ = await envs.reset("careless_game", "1", seed=0, split="train")
        before = metrics.JUDGE_ERRORS.labels("careless_game", "env_raised")._value.get()
        result = await envs.step(ep, "player", "²")
        after = metrics.JUDGE_ERRORS.labels("careless_game", "env_raised")._value.get()
        return result, after - before

    result, counted = run(go())
    assert result.done and not result.success and result.team_reward == 0.0  # exact: "²" != "2"
    assert result.info["judge_error"] == "env_raised" and counted == 1
    assert "ValueError" in result.info["parse_error"]
    assert result.info["stop_condition"] == "env_raised"


def test_the_example_reads_a_superscript_digit_as_no_guess():
    env = started(Guess({}), "5")
    result = run(env.step("player", "<guess>²</guess>"))
    assert (result.team_reward, result.done) == (0.0, False)
    assert "Answer with <guess>D</guess>" in env.observe("player")[-1]["content"]


def nan_reward(completion, **kwargs) -> float:
    return math.nan


class NanGame(VerifiersEnvironment):
    name = "nan_game"
    load = staticmethod(
        lambda: vf.SingleTurnEnv(dataset=_rows(), rubric=vf.Rubric(funcs=[nan_reward]))
    )


def test_a_non_finite_rubric_score_is_refused():
    with pytest.raises(ValueError, match="rubric score is nan: rewards must be finite"):
        run(started(NanGame({})).step("player", "0"))


class PeekingEnv(vf.MultiTurnEnv):
    """Calls the model itself, through the rollout's client."""

    async def env_response(self, messages, state, **kwargs):
        await state["client"].get_response(messages, "m", {})
        return [vf.UserMessage(content="?")]


class Peeking(VerifiersEnvironment):
    name = "peeking"
    load = staticmethod(lambda: PeekingEnv(dataset=_rows(), rubric=vf.Rubric(funcs=[exact])))


def test_an_env_that_calls_the_model_itself_is_told_why_it_cannot_run():
    env = started(Peeking({}))
    with pytest.raises(RuntimeError, match="calls the model itself"):
        run(env.step("player", "0"))


def group_reward(completions, **kwargs) -> list[float]:
    return [1.0] * len(completions)


@pytest.mark.parametrize(
    "loader, why",
    [
        (
            lambda: _rows(),
            "returned Dataset; the adapter runs vf.SingleTurnEnv and vf.MultiTurnEnv",
        ),
        (
            lambda: vf.SingleTurnEnv(
                dataset=_rows(), tool_defs=[{"name": "f", "description": "", "parameters": {}}]
            ),
            "gives the model tools",
        ),
        (
            lambda: vf.SingleTurnEnv(dataset=_rows(), rubric=vf.Rubric(funcs=[group_reward])),
            "scores rollouts as a group",
        ),
    ],
)
def test_what_does_not_map_is_refused_when_it_loads(loader, why):
    class Unmapped(VerifiersEnvironment):
        name = "unmapped"
        load = staticmethod(loader)

    with pytest.raises(TypeError, match=why):
        Unmapped({})


def test_a_subclass_must_name_its_loader():
    class Half(VerifiersEnvironment):
        name = "half"

    with pytest.raises(TypeError, match="must set `load`"):
        Half({})


def test_the_verifiers_game_keeps_every_rule_of_env_check(capsys):
    assert main(["env", "check", "examples.hubs.verifiers_guess:Guess"]) == 0
    assert "ok, every rule kept" in capsys.readouterr().out


def test_env_check_names_the_rule_a_nan_rubric_breaks(capsys):
    assert main(["env", "check", "tests.env.test_verifiers_adapter:NanGame"]) == 1
    assert "finite" in capsys.readouterr().out


SYSTEM_PROMPT = "Guess the secret digit (0-9). Answer with <guess>D</guess> and nothing else."


@pytest.mark.slow
def test_the_verifiers_example_is_taught_and_trains_on_the_tiny_model(tiny_model, tmp_path):
    """examples/verifiers_guess_L0_tiny.yaml: `atgrpo model teach` on the game's first prompts,
    then two steps on the taught tiny model: its answers parse, the rubric scores them, the pool
    updates."""
    answers = tmp_path / "answers.yaml"
    answers.write_text(yaml.safe_dump({"player": [f"<guess>{d}</guess>" for d in (1, 4, 6, 8)]}))
    model = tmp_path / "vf-guess"
    teach = f"--env examples.hubs.verifiers_guess:Guess --tasks 4 --steps 200 --out {model}"
    assert (
        main(["model", "teach", "--base", tiny_model, "--examples", str(answers), *teach.split()])
        == 0
    )
    samples = two_steps_of("verifiers_guess_L0_tiny.yaml", model, tmp_path / "run")
    formatted = [s for s in samples if s["team_reward"] > 0]
    assert len(formatted) >= len(samples) / 2  # the taught model answers <guess>D</guess>
    # the rubric's scores only: 1 x right + 0.2 x the share of formatted answers, or 0 mid-game
    assert all(0.0 <= s["team_reward"] <= 1.2 + 1e-9 for s in samples)


def test_options_max_turns_under_the_envs_own_still_scores_the_last_turn():
    env = started(Guess({"max_turns": 1}), "1")  # the verifiers env allows 3
    assert env.spec.max_turns == 1
    result = run(env.step("player", f"<guess>{(int(env.state['answer']) + 1) % 10}</guess>"))
    assert result.done and result.team_reward == pytest.approx(0.2)
    assert result.info["stop_condition"] == "options.max_turns"


def test_a_verifiers_v1_environment_is_refused_saying_what_to_do_instead():
    """verifiers.v1 (its Env.run(task, agents) drives its own agent loop) does not import here
    (its dependencies are not installed), so a class that lives in verifiers.v1 stands for one."""
    V1Env = type("SingleAgentEnv", (), {"__module__": "verifiers.v1.envs.single_agent"})

    class FromV1(VerifiersEnvironment):
        name = "from_v1"
        load = staticmethod(V1Env)

    with pytest.raises(TypeError) as refused:
        FromV1({})
    said = str(refused.value)
    assert "FromV1.load returned SingleAgentEnv, a verifiers v1 environment" in said
    assert "classic API only (vf.SingleTurnEnv, vf.MultiTurnEnv; verifiers 0.3.1)" in said
    assert "atgrpo.sdk.program.program_env" in said and "task.base_url" in said


def test_a_verifiers_without_the_classic_api_fails_the_import_naming_the_supported_version(
    subprocess_env,
):
    """verifiers 0.4.0 has no verifiers.legacy: hidden here, in a child interpreter."""
    code = "import sys; sys.modules['verifiers.legacy'] = None; import atgrpo.sdk.verifiers"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: atgrpo.sdk.verifiers supports verifiers' classic API")
    assert "verifiers 0.3.1; the installed verifiers 0.3.1 has no verifiers.legacy" in last
    assert "pip install --no-deps verifiers==0.3.1" in last and "task.base_url" in last

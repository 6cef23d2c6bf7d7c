"""OpenEnv environments through atgrpo.sdk.openenv: the mapping pinned on a game written in
openenv-core's own form (examples/hubs/openenv_guess.py), the conformance check, and a few steps
of training on the tiny model taught its answer format."""

from __future__ import annotations

import json
import math

import pytest
from openenv.core.env_server.interfaces import Environment as OpenEnvBase
from openenv.core.env_server.types import Action, Observation, State
from pydantic import field_validator

from atgrpo.cli.main import main
from atgrpo.sdk.judge import JudgeError
from atgrpo.sdk.openenv import OpenEnvEnvironment, parse_action
from examples.hubs.openenv_guess import Guess, GuessAction
from tests.env.conftest import two_steps_of


@pytest.mark.parametrize(
    "text, guess",
    [('{"guess": 4}', 4), ('```json\n{"guess": 7}\n```', 7), (" 3 ", 3), ("```\n5\n```", 5)],
)
def test_an_answer_is_json_fenced_json_or_the_one_required_field(text, guess):
    assert parse_action(text, GuessAction).guess == guess


@pytest.mark.parametrize(
    "text, why",
    [
        ("ten", "valid integer"),
        ('{"guess": 12}', "less than or equal to 9"),
        ('{"guess": 1, "extra": 2}', "extra"),
        ("{}", "guess: Field required"),
    ],
)
def test_an_answer_that_is_no_action_scores_zero_and_says_why(text, why):
    env = Guess({})
    env.reset("0", 0, "train")
    result = env.step("player", text)
    assert result.team_reward == 0.0 and not result.done and why in result.info["parse_error"]
    assert "not an action" in env.observe("player")[1]["content"]  # the role is told, once
    env.step("player", "0" if env.env._secret else "1")
    assert "not an action" not in env.observe("player")[1]["content"]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("[" * 100_000 + "]" * 100_000, "too_deep"),  # json.loads: RecursionError
        ('{"guess": ' + "[" * 5_000 + "]" * 5_000 + "}", "too_deep"),
        ("²", "not_action"),
        ("9" * 5_000, "not_action"),  # past int()'s 4,300 digits
        ('{"guess": 1e999}', "not_action"),
    ],
)
def test_hostile_text_is_a_format_failure_never_an_exception(text, reason):
    env = Guess({})
    env.reset("0", 0, "train")
    result = env.step("player", text)
    assert (result.team_reward, result.done) == (0.0, False)
    assert result.info["judge_error"] == reason and result.info["parse_error"]


class Picky(Action):
    """An action model whose own validator raises on some text, as a TypeError."""

    word: str

    @field_validator("word")
    @classmethod
    def _short(cls, v: str) -> str:
        if len(v) > 3:
            raise TypeError("too long")
        return v


def test_an_action_validator_that_raises_on_model_text_is_a_format_failure():
    with pytest.raises(JudgeError, match="raised TypeError: too long") as err:
        parse_action("abcdef", Picky)
    assert err.value.reason == "not_action"
    assert parse_action("abc", Picky).word == "abc"


def test_the_game_is_played_through_the_adapter_and_a_fork_is_independent():
    env = Guess({})
    env.reset("3", 3, "train")
    system, user = env.observe("player")
    assert '"guess"' in system["content"] and "metadata" not in system["content"]
    assert json.loads(user["content"].removeprefix("Observation: ")) == {
        "guesses": 0,
        "hint": "guess a digit from 0 to 9",
    }
    secret = env.env._secret
    fork = env.fork()
    wrong = env.step("player", str((secret + 1) % 10))
    assert (wrong.team_reward, wrong.done, wrong.success) == (0.0, False, False)
    assert env.env.state.step_count == 1 and fork.env.state.step_count == 0
    right = fork.step("player", json.dumps({"guess": secret}))
    assert (right.team_reward, right.done, right.success) == (1.0, True, True)
    again = Guess({})
    again.reset("3", 3, "train")
    assert again.env._secret == secret  # the task's seed reaches OpenEnv's reset


class Bare(Action):
    text: str


class BareObservation(Observation):
    echo: str = ""


class Broken(OpenEnvBase):
    """reset takes no seed; step's reward is NaN."""

    def reset(self):
        return BareObservation()

    def step(self, action):
        return BareObservation(echo=action.text, reward=math.nan)

    @property
    def state(self):
        return State()


class BrokenGame(OpenEnvEnvironment):
    name = "broken_game"
    openenv = Broken
    action = Bare


def test_a_non_finite_reward_is_refused_and_a_reset_without_a_seed_is_called_bare():
    env = BrokenGame({})
    env.reset("0", 0, "train")  # Broken.reset takes no arguments
    with pytest.raises(ValueError, match="rewards must be finite"):
        env.step("player", "hi")


def test_a_subclass_must_name_its_openenv_class():
    class Half(OpenEnvEnvironment):
        name = "half"
        action = Bare

    with pytest.raises(TypeError, match="must set `openenv`"):
        Half({})


def test_the_openenv_game_keeps_every_rule_of_env_check(capsys):
    assert main(["env", "check", "examples.hubs.openenv_guess:Guess"]) == 0
    assert "ok, every rule kept" in capsys.readouterr().out


@pytest.mark.slow
def test_the_openenv_example_trains_on_the_taught_tiny_model(tiny_model, tmp_path):
    """examples/openenv_guess_L0_tiny.yaml, two steps on the tiny model taught to guess digits:
    its answers parse, the OpenEnv game scores them, and the pool updates."""
    from atgrpo.models.taught import role_prompts, teach

    model = teach(
        tiny_model,
        tmp_path / "guess",
        role_prompts(Guess({}), ["player"], tasks=4),
        {"player": ["1", "3", "5", "7", '{"guess": 8}']},
        steps=200,
    )
    samples = two_steps_of("openenv_guess_L0_tiny.yaml", model, tmp_path / "run")
    parsed = [s for s in samples if "parse_error" not in s["info"]]
    assert len(parsed) >= len(samples) / 2  # the taught model answers with digits
    # every team reward is the game's: 1 for the guess that found the secret, else 0
    assert {s["team_reward"] for s in samples} <= {0.0, 1.0}

"""A guessing game written as an OpenEnv environment (openenv-core's own form: an `Environment`
with pydantic `Action` and `Observation` models), and the atgrpo class that trains it.

The secret is a digit; each guess is answered "higher", "lower" or "correct", and a correct
guess ends the episode with reward 1. Train it with `examples/openenv_guess_L0_tiny.yaml`.
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from atgrpo.sdk.openenv import OpenEnvEnvironment


class GuessAction(Action):
    guess: int = Field(..., ge=0, le=9, description="your guess: a digit")


class GuessObservation(Observation):
    hint: str = Field(default="", description="guess a digit, higher, lower or correct")
    guesses: int = Field(default=0, description="guesses so far")


class GuessEnvironment(Environment):
    """Guess the secret digit; each wrong guess is told higher or lower."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, low: int = 0, high: int = 9):
        super().__init__()
        self.low, self.high = low, high
        self._secret = low
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._secret = random.Random(seed).randint(self.low, self.high)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(hint=f"guess a digit from {self.low} to {self.high}")

    def step(
        self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._state.step_count += 1
        n = self._state.step_count
        if action.guess == self._secret:
            return GuessObservation(hint="correct", guesses=n, done=True, reward=1.0)
        hint = "higher" if action.guess < self._secret else "lower"
        return GuessObservation(hint=hint, guesses=n, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class Guess(OpenEnvEnvironment):
    name = "openenv_guess"
    openenv = GuessEnvironment
    action = GuessAction
    max_turns = 3

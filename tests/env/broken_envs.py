"""Environments that each break one rule of `atgrpo env check` (and one that keeps them all while
playing its turns in parallel), as a third party might write them."""

import random

from atgrpo.sdk import Environment, EnvSpec, StepResult, task_rng
from tests.env.sdk_envs import CounterEnv


class UnseededReset(CounterEnv):
    """Draws its task from the global random module, not from (split, seed)."""

    name = "unseeded"

    def reset(self, task_id, seed, split):
        self.target = random.randint(5, 1_000_000)


class NoisyStep(CounterEnv):
    """Its reward depends on a coin, not on the state and the answer."""

    name = "noisy"

    def step(self, agent, action):
        return StepResult(team_reward=random.random(), local_reward=0.0)


class ClassLog(CounterEnv):
    """Keeps its log on the class: every episode and every fork shares it."""

    name = "class_log"
    shared_log: list = []

    def step(self, agent, action):
        ClassLog.shared_log.append(action[:10])
        return super().step(agent, action)

    def observe(self, agent):
        return [{"role": "user", "content": f"{agent}: moves so far {ClassLog.shared_log}"}]


class ForkIsSelf(CounterEnv):
    """Its fork hands back the same object."""

    name = "fork_is_self"

    def fork(self):
        return self


class NanReward(CounterEnv):
    name = "nan_reward"

    def step(self, agent, action):
        return StepResult(float("nan"), 0.0)


class RaisesOnText(CounterEnv):
    """Parses the answer with int() and lets the error out."""

    name = "raises_on_text"

    def step(self, agent, action):
        self.total += int(action)
        return StepResult(0.0, 0.0)


class PickBase(Environment):
    """Two roles each pick a digit at once; they win when the digits add up to the target. The
    target and the picks of earlier turns are what the agents see."""

    name = "pick"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec("pick", ("a", "b"), ("a", "b"), max_turns=3, parallel=True)
        self.target, self.history, self.pending = 0, [], {}

    def reset(self, task_id, seed, split):
        self.target = task_rng(split, seed).randint(2, 18)

    def observe(self, agent):
        return [{"role": "user", "content": f"target {self.target}; turns so far {self.history}"}]

    def _digit(self, action):
        text = action.strip()
        return int(text) if text.isdecimal() and len(text) == 1 else 0


class PickAtOnce(PickBase):
    """Keeps the turn's first pick pending and resolves the turn in the last agent's step."""

    def step(self, agent, action):
        self.pending[agent] = self._digit(action)
        if len(self.pending) < 2:
            return StepResult(0.0, 0.0)
        won = sum(self.pending.values()) == self.target
        self.history.append(dict(self.pending))
        self.pending = {}
        return StepResult(float(won), 0.0, done=won, success=won)


class PickResolvesEarly(PickBase):
    """Says it is parallel, but writes each pick into what the agents see at once."""

    def step(self, agent, action):
        self.history.append({agent: self._digit(action)})
        won = sum(next(iter(h.values())) for h in self.history[-2:]) == self.target
        return StepResult(float(won), 0.0, done=won, success=won)


class OnlyWhoseTurn(CounterEnv):
    """Correct, and strict: observe() refuses an agent whose turn it is not. The tree driver only
    ever asks the agent about to act, so the check must not ask others."""

    name = "only_whose_turn"

    def __init__(self, options=None):
        super().__init__(options)
        self.next = 0

    def observe(self, agent):
        if agent != self.spec.turn_order[self.next]:
            raise ValueError(f"it is not {agent}'s turn")
        return super().observe(agent)

    def step(self, agent, action):
        self.next = (self.next + 1) % len(self.spec.turn_order)
        return super().step(agent, action)


class NamedPuzzles(CounterEnv):
    """Correct: a finite list of named tasks per split, and reset refuses any other id, so the
    check must play the listed ids (not ids it makes up)."""

    name = "named_puzzles"

    def task_ids(self, split):
        return [f"{split}-puzzle-{c}" for c in "abcde"]

    def reset(self, task_id, seed, split):
        if task_id not in self.task_ids(split):
            raise ValueError(f"no task {task_id!r}")
        self.target = 5 + "abcde".index(task_id[-1]) + (split == "eval")

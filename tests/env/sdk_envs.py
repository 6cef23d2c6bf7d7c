"""Environments written for the SDK tests: each pins one rule of the host."""

import asyncio
import time

from atgrpo.sdk import Environment, EnvSpec, StepResult, task_rng


class CounterEnv(Environment):
    """Two agents add numbers to a shared counter; done when it reaches the task's target."""

    name = "counter"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec(
            "counter", ("a", "b"), ("a", "b"), max_turns=self.options.get("max_turns", 3)
        )
        self.total, self.target, self.log = 0, 0, []

    def reset(self, task_id, seed, split):
        self.target = task_rng(split, seed).randint(5, 9)

    def observe(self, agent):
        return [
            {
                "role": "user",
                "content": f"{agent}: total {self.total}, target {self.target}, log {self.log}",
            }
        ]

    def step(self, agent, action):
        if not action.strip().isdecimal() or len(action.strip()) > 3:
            return StepResult(0.0, -1.0, info={"parse_error": f"not a number: {action[:20]!r}"})
        self.total += int(action)
        self.log.append((agent, int(action)))
        done = self.total >= self.target
        return StepResult(
            team_reward=float(done), local_reward=0.1, done=done, success=self.total == self.target
        )


class SlowEnv(CounterEnv):
    """Async steps that take a while and count themselves: `steps` finished, `inside` running
    now, `most_inside` the most that ever ran at once on this episode."""

    name = "slow"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec("slow", ("a", "b"), ("a", "b"), max_turns=100)
        self.steps = self.inside = self.most_inside = 0

    async def step(self, agent, action):
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        await asyncio.sleep(0.01)
        self.inside -= 1
        self.steps += 1
        return StepResult(0.0, 0.0)


class FiniteEnv(CounterEnv):
    name = "finite"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec("finite", ("a", "b"), ("a", "b"), max_turns=3)

    def task_ids(self, split):
        return [f"{split}-{i}" for i in range(5)]


class CarelessEnv(CounterEnv):
    """What a careless third-party environment does, chosen by option `mode` (one bug each)."""

    name = "careless"

    def __init__(self, options=None):
        super().__init__(options)
        self.spec = EnvSpec("careless", ("a", "b"), ("a", "b"), max_turns=3)
        mode = self.options.get("mode", "")
        if mode == "no_spec":
            del self.spec
        elif mode == "init_raises":
            raise RuntimeError("cannot open the puzzle file")
        self.mode = mode

    def reset(self, task_id, seed, split):
        if self.mode == "reset_raises":
            raise ZeroDivisionError("division by zero")
        super().reset(task_id, seed, split)

    def observe(self, agent):
        return "a bare string" if self.mode == "observe_str" else super().observe(agent)

    def step(self, agent, action):
        rewards = {"nan_reward": float("nan"), "inf_reward": float("inf"), "str_reward": "1.0"}
        if self.mode in rewards:
            return StepResult(rewards[self.mode], 0.0)
        if self.mode == "numpy_reward":  # not a mistake: a numpy scalar is a number
            import numpy as np

            return StepResult(np.float32(0.5), np.int64(1))
        if self.mode == "step_raises":
            raise ValueError("boom in step")
        if self.mode == "step_blocks":  # a slow judge in a plain `def step`
            time.sleep(0.5)
        return super().step(agent, action)

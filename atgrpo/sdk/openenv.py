"""OpenEnv environments (`openenv-core`) as atgrpo environments, in process.

An OpenEnv environment is a class with `reset(seed, episode_id)`, `step(action)` and `state`,
whose actions and observations are pydantic models (`openenv.core.env_server.types.Action`,
`Observation`: `done`, `reward`, `metadata` and the env's own fields). Subclass
`OpenEnvEnvironment`, name the OpenEnv class and its action model, and the env service hosts it
like any other environment:

    class Guess(OpenEnvEnvironment):
        name = "guess"
        openenv = GuessEnvironment        # the OpenEnv Environment subclass
        action = GuessAction              # its Action model
        agents = ("player",)              # roles that act on it, in turn

How it maps (docs/environments.md, "Environments from the hubs"):
- reset(task_id, seed, split) builds the OpenEnv class (with `env.options["openenv_kwargs"]`) and
  calls its reset with the task's seed and an episode id; one that takes neither is called bare.
- A role sees a system message (the action's JSON schema and how to answer) and the latest
  observation as JSON (its own fields; `done`, `reward` and `metadata` are the adapter's).
- A role's text is the action: a JSON object, fenced JSON (read by atgrpo.sdk.judge's bounded
  parser), or, for an action with one required field, that field's raw value. Text that does not
  validate is not sent: it scores 0 as a format failure (`info["judge_error"]` and
  `info["parse_error"]`), and the episode goes on (max_turns bounds it).
- The step's reward is the team reward; an episode succeeds when it ends with a reward of at
  least `success_reward`. A reward that is not a finite number is the environment's bug: refused.
- fork() deep-copies the OpenEnv object, as tree sampling needs: an environment that holds a
  process, a socket or a container cannot be forked, and is better served by its own adapter.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from atgrpo.sdk.env import Environment, EnvSpec, Message, StepResult, turn_order_option
from atgrpo.sdk.host import MAX_ACTION_CHARS
from atgrpo.sdk.judge import JudgeError, failure_info, literal

# The observation fields OpenEnv's base class defines: the adapter reads them, the model is not
# shown them.
_BASE_FIELDS = {"done", "reward", "metadata"}
_FENCE = re.compile(r"^```[a-zA-Z]*\n(.*)\n```$", re.DOTALL)


def parse_action(text: str, action: type[BaseModel]) -> BaseModel:
    """`text` as an `action`: a JSON object, fenced JSON, or the raw value of the action's one
    required field. Raises JudgeError saying what is wrong: JSON is read with the bounded parser
    (nesting, size, elements), and the action model's own validators run on model text too."""
    text = text.strip()
    fenced = _FENCE.match(text)
    body = fenced.group(1).strip() if fenced else text
    try:
        value: Any = literal(body, "the action", max_chars=MAX_ACTION_CHARS, python=False)
    except JudgeError as err:
        if err.reason != "not_data" and body[:1] in "[{":  # JSON, past a bound
            raise
        value = body  # not JSON: the raw value of the one required field
    if not isinstance(value, dict):
        required = action.model_json_schema().get("required", [])
        if len(required) != 1:
            raise JudgeError(
                "not_action", f"answer with a JSON object of {action.__name__}'s fields"
            )
        value = {required[0]: value}
    try:
        return action.model_validate(value)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'action'}: {e['msg']}" for e in err.errors()
        )
        raise JudgeError("not_action", f"not a valid {action.__name__}: {problems}") from None
    except Exception as err:  # noqa: BLE001 - a validator of the env's that raised on this text
        raise JudgeError(
            "not_action", f"{action.__name__}'s validation raised {type(err).__name__}: {err}"
        ) from None


def _reward(value: Any) -> float:
    if value is None:
        return 0.0
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(
            f"the OpenEnv environment returned reward {value!r}: rewards must be finite numbers"
        )
    return reward


class OpenEnvEnvironment(Environment):
    """Subclass and set `name`, `openenv` and `action`; `agents`, `max_turns` and
    `success_reward` as the task needs. Options: `openenv_kwargs` (the OpenEnv class's
    constructor arguments), `max_turns`, and the router's `turn_order`."""

    openenv: ClassVar[type]
    action: ClassVar[type[BaseModel]]
    agents: ClassVar[tuple[str, ...]] = ("player",)
    max_turns: ClassVar[int] = 8
    success_reward: ClassVar[float] = 1.0
    description: ClassVar[str] = ""

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        for attr in ("name", "openenv", "action"):
            if not getattr(type(self), attr, None):
                raise TypeError(f"{type(self).__name__} must set `{attr}` (OpenEnvEnvironment)")
        self.spec = EnvSpec(
            name=self.name,
            agents=self.agents,
            turn_order=turn_order_option(self.options, self.agents, self.name),
            max_turns=int(self.options.get("max_turns", self.max_turns)),
            description=self.description or (self.openenv.__doc__ or "").strip().split("\n")[0],
        )
        schema = self.action.model_json_schema()
        schema.get("properties", {}).pop("metadata", None)  # OpenEnv's own, not the task's
        self._schema = json.dumps(schema, separators=(",", ":"))
        self.env: Any = None
        self.observation: Any = None
        self.error = ""

    def reset(self, task_id: str, seed: int, split: str) -> None:
        self.env = self.openenv(**dict(self.options.get("openenv_kwargs", {})))
        params = inspect.signature(self.env.reset).parameters
        anything = any(p.kind is p.VAR_KEYWORD for p in params.values())
        takes = {name for name in ("seed", "episode_id") if anything or name in params}
        given = {"seed": seed, "episode_id": f"{split}-{task_id}"}
        kwargs = {name: value for name, value in given.items() if name in takes}
        self.observation, self.error = self.env.reset(**kwargs), ""

    def observe(self, agent: str) -> list[Message]:
        shown = self.observation.model_dump(mode="json", exclude=_BASE_FIELDS)
        system = (
            f"You act in the environment {self.name!r}. Answer with one action: a JSON object "
            f"that fits this schema, and nothing else.\nSchema: {self._schema}"
        )
        user = f"Observation: {json.dumps(shown, sort_keys=True)}"
        if self.error:
            user += f"\nYour last answer was not an action ({self.error}); answer again."
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def step(self, agent: str, action: str) -> StepResult:
        try:
            parsed = parse_action(action, self.action)
        except JudgeError as err:
            self.error = str(err)
            return StepResult(team_reward=0.0, info=failure_info(err))
        self.observation, self.error = self.env.step(parsed), ""
        reward, done = _reward(self.observation.reward), bool(self.observation.done)
        return StepResult(
            team_reward=reward, done=done, success=done and reward >= self.success_reward
        )

"""`verifiers` environments (its classic API: `vf.SingleTurnEnv`, `vf.MultiTurnEnv`, `vf.Rubric`,
`vf.Parser`) as atgrpo environments, in process.

A verifiers environment is an object that a module's `load_environment(**kwargs)` returns: a
dataset of prompts (`question`/`answer`/`info` rows, or a `prompt` column), an optional
`env_response` that answers each model turn, stop conditions (`@vf.stop`, `max_turns`) and a
rubric of reward functions. verifiers runs the whole episode itself against an OpenAI-style
client; atgrpo instead steps it one model turn at a time, so that tree sampling can fork it
between turns. Subclass `VerifiersEnvironment` and name the loader:

    class Guess(VerifiersEnvironment):
        name = "guess"
        load = staticmethod(load_environment)   # returns a vf.MultiTurnEnv
        agents = ("player",)                     # roles that write the assistant turns, in turn

How it maps (docs/environments.md, "Environments from the hubs"):
- Tasks are the dataset's rows: task ids "0".."n-1" of `get_dataset()` for the train split and of
  `get_eval_dataset()` for eval (verifiers falls back to the train rows without an eval set).
  The seed is not used: a row is the task.
- reset builds the rollout state as verifiers does (`init_state`, then the env's `setup_state`).
- A role sees the conversation so far: the row's prompt, the earlier answers, and each
  `env_response`. Its text becomes the assistant message of the turn.
- After each answer the env's stop conditions are checked, then `env_response` gives the next
  prompt. When the episode stops, verifiers' cleanup renders the completion and the rubric scores
  it: that score is the last step's team reward, and the episode succeeds when it reaches the
  env's `pass_threshold`. Earlier steps carry the reward the env set on their trajectory step in
  `add_trajectory_step`, or 0. A reward that is not a finite number is refused.
- fork() deep-copies the rollout state (the verifiers environment object is shared).
Not mapped (refused with a message when the env uses them): tool calls (`ToolEnv`,
`StatefulToolEnv`: the policy's text is the answer, not a function call), group reward functions
and env-provided advantages (atgrpo computes advantages itself), environments that call the
model themselves, and verifiers' v1 API (`verifiers.v1`: an installed verifiers without the
classic API fails the import, a v1 environment is refused when it loads, each saying to train it
as an agent program through atgrpo.sdk.program instead). A `vf.Error` raised by the env ends the
episode as it does in verifiers; so does any other exception its hooks raise on an answer, which
verifiers would let fail the rollout: here the step is also a format failure (`judge_error`
"env_raised"), so no answer voids its episode.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import verifiers as vf

from atgrpo.errors import AtgrpoError
from atgrpo.sdk.env import Environment, EnvSpec, Message, StepResult, turn_order_option
from atgrpo.sdk.judge import JudgeError, failure_info

SUPPORTED = "0.3.1"  # the last verifiers with the classic API (pyproject.toml, extra verifiers)
# Why the adapter takes the classic API only, and what to do with a v1 environment instead.
V1_INSTEAD = (
    "the adapter steps a classic environment one model turn at a time through its own hooks, so "
    "tree sampling can fork it between turns; a v1 environment's Env.run(task, agents) drives its "
    "own agent loop, which cannot be forked. Train a v1 environment as an agent program instead: "
    "wrap it in atgrpo.sdk.program.program_env with a run(task, client) that runs it with its "
    "model client pointed at task.base_url (docs/environments.md, 'Agent programs')"
)

try:  # 0.4.0 removed the classic API (verifiers.legacy, aliased at verifiers.<module>)
    from verifiers.legacy.utils.message_utils import normalize_messages
except ImportError as err:
    raise ImportError(
        f"atgrpo.sdk.verifiers supports verifiers' classic API (vf.SingleTurnEnv, "
        f"vf.MultiTurnEnv), verifiers {SUPPORTED}; the installed verifiers "
        f"{getattr(vf, '__version__', '?')} has no verifiers.legacy (0.4.0 removed it for the "
        "v1 API). Install {SUPPORTED} "
        f"(`pip install --no-deps verifiers=={SUPPORTED}`, as make install does): {V1_INSTEAD}"
    ) from err

log = logging.getLogger(__name__)


class ModelCallRefused(RuntimeError):
    """The environment called the model itself: not something the adapter can run."""


def _refusal(err: BaseException | None) -> ModelCallRefused | None:
    while err is not None and not isinstance(err, ModelCallRefused):
        err = err.__cause__ or err.__context__
    return err


def _record(state: Any, err: Exception) -> None:
    """A vf.Error ends the episode, as in verifiers, unless it wraps the client's refusal: that
    is the adapter's limit, said as such and never scored."""
    refused = _refusal(err)
    if refused is not None:
        raise refused from err
    state["error"] = err


class _PolicyClient(vf.Client):
    """What `init_state` requires as the rollout's client. atgrpo samples the policy itself, so
    an environment that calls the model through it is one the adapter cannot run."""

    def __init__(self) -> None:
        super().__init__(None)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise ModelCallRefused(
            "this verifiers environment calls the model itself (state['client']); atgrpo samples "
            "the policy and steps the environment, so such an environment cannot be adapted"
        )

    setup_client = to_native_tool = to_native_prompt = get_native_response = _refuse
    raise_from_native_response = from_native_response = _refuse

    async def close(self) -> None:
        return None

    def __deepcopy__(self, memo: dict) -> _PolicyClient:
        return self  # a fork's state shares it: it holds nothing


_CLIENT = _PolicyClient()
# One loaded verifiers environment per (adapter class, loader arguments) and process: loading
# builds the dataset, and the host makes an adapter instance per episode.
_LOADED: dict[tuple[type, str], tuple[Any, dict[str, Any]]] = {}  # the env, its rows by split


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        parts = [
            t
            for p in content
            for t in [p.get("text") if isinstance(p, dict) else getattr(p, "text", None)]
            if isinstance(t, str)
        ]
        return " ".join(parts)
    return "" if content is None else str(content)


def _as_chat(messages: Any) -> list[Message]:
    chat = []
    for m in normalize_messages(messages, field_name="prompt"):
        role = getattr(m, "role", "user")
        if role == "tool" or getattr(m, "tool_calls", None):
            raise ValueError(
                "the verifiers environment's conversation holds tool calls: tool-using "
                "environments are not supported by the atgrpo adapter"
            )
        chat.append(
            {
                "role": role if role in ("system", "assistant") else "user",
                "content": _text(getattr(m, "content", "")),
            }
        )
    return chat


def _raised_on_answer(state: Any, err: Exception) -> dict[str, Any]:
    """An exception other than vf.Error from the env's hooks on an answer (int() of a superscript
    digit, json.loads of deep nesting). verifiers would fail the rollout, and a failed episode
    yields no samples: a policy could void its bad episodes so. Here the episode ends as on a
    vf.Error (the rubric scores it) and the step is a format failure, its traceback logged."""
    log.warning("the verifiers environment raised on an answer", exc_info=err)
    state["error"] = vf.Error(f"{type(err).__name__}: {err}")
    state.update(is_completed=True, stop_condition="env_raised")
    message = f"the environment raised {type(err).__name__} on this answer: {err}"
    return failure_info(JudgeError("env_raised", message[:300]))


def _finite(value: Any, what: str) -> float:
    reward = float(value if value is not None else 0.0)
    if not math.isfinite(reward):
        raise ValueError(f"the verifiers environment's {what} is {value!r}: rewards must be finite")
    return reward


class VerifiersEnvironment(Environment):
    """Subclass and set `name` and `load` (a callable returning a verifiers environment, usually
    its module's `load_environment`); `agents` and `max_turns` as the task needs. Options:
    `verifiers_kwargs` (the loader's arguments), `max_turns`, and the router's `turn_order`."""

    load: ClassVar[Callable[..., Any]]
    agents: ClassVar[tuple[str, ...]] = ("player",)
    max_turns: ClassVar[int] = 8  # when the verifiers env sets none (max_turns=-1)
    description: ClassVar[str] = ""
    shared_on_fork = (*Environment.shared_on_fork, "vf_env", "_split_rows")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        for attr in ("name", "load"):
            if not getattr(type(self), attr, None):
                raise TypeError(f"{type(self).__name__} must set `{attr}` (VerifiersEnvironment)")
        self.vf_env, self._split_rows = self._loaded()
        own = getattr(self.vf_env, "max_turns", -1)
        turns = int(self.options.get("max_turns") or (own if own > 0 else self.max_turns))
        doc = (type(self.vf_env).__doc__ or "").strip().split("\n")[0]
        self.spec = EnvSpec(
            name=self.name,
            agents=self.agents,
            turn_order=turn_order_option(self.options, self.agents, self.name),
            max_turns=turns,
            description=self.description or doc,
        )
        self._last = turns * len(self.spec.turn_order)
        self.state: Any = None
        self.prompt: Any = None

    def _loaded(self) -> tuple[Any, dict[str, Any]]:
        kwargs = dict(self.options.get("verifiers_kwargs", {}))
        key = (type(self), json.dumps(kwargs, sort_keys=True, default=repr))
        if key not in _LOADED:
            env = type(self).load(**kwargs)
            _check_supported(env, type(self).__name__)
            _LOADED[key] = (env, {})
        return _LOADED[key]

    def _rows(self, split: str) -> Any:
        if split not in self._split_rows:
            env = self.vf_env
            rows = env.get_eval_dataset() if split == "eval" else env.get_dataset()
            self._split_rows[split] = rows
        return self._split_rows[split]

    def task_ids(self, split: str) -> list[str]:
        return [str(i) for i in range(len(self._rows(split)))]

    async def reset(self, task_id: str, seed: int, split: str) -> None:
        rows = self._rows(split)
        if not task_id.isdecimal() or int(task_id) >= len(rows):
            raise ValueError(
                f"{self.name}: task id {task_id!r} is not a row of the {split} dataset "
                f"(ids are 0..{len(rows) - 1})"
            )
        row = dict(rows[int(task_id)])
        self.state = await self.vf_env.init_state(row, _CLIENT, self.name)
        try:
            state = await self.vf_env.setup_state(self.state)
            self.state = self.state if state is None else state
        except vf.Error as err:
            _record(self.state, err)
        self.prompt = self.state["prompt"]

    def observe(self, agent: str) -> list[Message]:
        return _as_chat(self.prompt)

    async def step(self, agent: str, action: str) -> StepResult:
        env, state = self.vf_env, self.state
        answer = normalize_messages([{"role": "assistant", "content": action}])
        turn = {
            "prompt": self.prompt,
            "completion": answer,
            "response": None,
            "tokens": None,
            "reward": None,
            "advantage": None,
            "is_truncated": False,
            "trajectory_id": state["trajectory_id"],
            "extras": {},
        }
        info: dict[str, Any] = {}
        try:
            goes_on = await self._answered(state, turn)
        except Exception as err:  # noqa: BLE001 - the env's own code, on model text
            if isinstance(err, AtgrpoError) or _refusal(err) is not None:
                raise
            goes_on, info = False, _raised_on_answer(state, err)
        if goes_on:
            return StepResult(team_reward=_finite(turn["reward"], "step reward"))
        await env.cleanup(state)  # renders the completion, as verifiers does before scoring
        await env.rubric.score_rollout(state)
        await env.rubric.cleanup(state)
        reward = _finite(state["reward"], "rubric score")
        return StepResult(
            team_reward=reward,
            done=True,
            success=reward >= getattr(env, "pass_threshold", 1.0),
            info={**info, "stop_condition": str(state.get("stop_condition"))},
        )

    async def _answered(self, state: Any, turn: dict[str, Any]) -> bool:
        """The env's hooks that read the answer (add_trajectory_step, its stop conditions,
        env_response); whether the episode goes on."""
        env = self.vf_env
        await env.add_trajectory_step(state, turn)
        if await self._over(state):
            return False
        try:
            self.prompt = await env.get_prompt_messages(state)  # runs env_response
        except vf.Error as err:
            _record(state, err)
        return not await env.is_completed(state)

    async def _over(self, state: Any) -> bool:
        """The env's stop conditions, or the episode's last answer (options.max_turns may be
        under the verifiers env's own): the rubric scores either way."""
        if await self.vf_env.is_completed(state):
            return True
        if len(state["trajectory"]) < self._last:
            return False
        state.update(is_completed=True, stop_condition="options.max_turns")
        return True

    # verifiers' token-usage tracker cannot be deep-copied (it exposes a mappingproxy); the
    # adapter never counts tokens into it, so a fork gets a fresh one.
    _UNCOPIED = ("usage_tracker", "usage")

    def fork(self) -> VerifiersEnvironment:
        if self.state is None:
            return super().fork()
        held = {k: self.state.pop(k) for k in self._UNCOPIED if k in self.state}
        try:
            twin = super().fork()
        finally:
            self.state.update(held)
        if held:
            self.vf_env._get_usage_tracker(twin.state, create_if_missing=True)
        return twin


def _check_supported(env: Any, who: str) -> None:
    """Refuse, when it loads, a verifiers environment whose features do not map."""
    if any(c.__module__.startswith("verifiers.v1") for c in type(env).__mro__):
        raise TypeError(
            f"{who}.load returned {type(env).__name__}, a verifiers v1 environment; "
            f"atgrpo.sdk.verifiers supports verifiers' classic API only (vf.SingleTurnEnv, "
            f"vf.MultiTurnEnv; verifiers {SUPPORTED}): {V1_INSTEAD}"
        )
    if not isinstance(env, vf.MultiTurnEnv):
        raise TypeError(
            f"{who}.load returned {type(env).__name__}; the adapter runs vf.SingleTurnEnv and "
            "vf.MultiTurnEnv environments (verifiers' classic API)"
        )
    tool_envs = {"ToolEnv", "StatefulToolEnv"}  # by name: importing them needs verifiers[all]
    if tool_envs & {c.__name__ for c in type(env).__mro__} or getattr(env, "tool_defs", None):
        raise TypeError(
            f"{who}: {type(env).__name__} gives the model tools; the adapter steps plain text "
            "answers and does not support tool calls"
        )
    rubric = env.rubric
    if rubric.has_group_rewards or rubric.has_advantages or env.provides_advantages:
        raise TypeError(
            f"{who}: the rubric scores rollouts as a group or provides advantages; atgrpo groups "
            "samples and computes advantages itself: use per-rollout reward functions"
        )

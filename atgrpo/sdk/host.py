"""EnvHost: the EnvService's logic over a registry and an episode store, free of gRPC.

env_svc hosts the built-in environments with it, and `atgrpo env serve module:Class` hosts a
single third-party class with it, so both behave the same over the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from atgrpo.errors import AtgrpoError, EnvCodeError, FailedPrecondition, InvalidArgument
from atgrpo.sdk import metrics
from atgrpo.sdk.env import Environment, EnvSpec, Message, Sandbox, StepResult
from atgrpo.sdk.registry import Registry
from atgrpo.sdk.store import Episode, EpisodeStore

MAX_FORK = 1024
MAX_ACTION_CHARS = 1 << 20

log = logging.getLogger(__name__)


# Synchronous steps run here, one at a time as they did on the event loop, so a slow judge in a
# plain `def step` delays no health check and no other env's async step.
_STEP_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-step")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _off_loop(method: Callable[..., Any], *args: Any) -> Any:
    """`method(*args)`: an `async def` on the event loop (it awaits its own slow parts), any other
    in the step thread (what it returns is awaited if it is awaitable)."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    call = functools.partial(contextvars.copy_context().run, method, *args)
    return await _maybe_await(await asyncio.get_running_loop().run_in_executor(_STEP_THREAD, call))


def _json_safe(info: Mapping[str, Any], where: str) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(dict(info), default=str, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise EnvCodeError(
            f"{where} returned info that is not JSON ({err}); environments must return "
            "plain dicts of str, numbers, bools, lists"
        ) from None


def _named(name: str, env: Any) -> str:
    """An environment in an error about its own code: its name and the class that holds the bug."""
    cls = env if isinstance(env, type) else type(env)
    return f"env {name!r} ({cls.__module__}.{cls.__qualname__})"


@contextlib.contextmanager
def env_code(where: str) -> Iterator[None]:
    """Exceptions from an environment's own code become EnvCodeError naming it (with the traceback
    in this service's log). atgrpo's errors pass through: a sandbox that is down mid-step is still
    UNAVAILABLE, and retried."""
    try:
        yield
    except AtgrpoError:
        raise
    except Exception as err:
        log.exception("%s raised", where)
        raise EnvCodeError(
            f"{where} raised {type(err).__name__}: {err}. This is a bug in the environment, "
            "not in atgrpo: fix it (the traceback is in the env service's log)"
        ) from None


def _checked_result(result: Any, where: str) -> StepResult:
    if not isinstance(result, StepResult):
        raise EnvCodeError(f"{where} returned {type(result).__name__}, not a StepResult")
    for name in ("team_reward", "local_reward"):
        value = getattr(result, name)
        try:  # a numpy or torch scalar is a number too; a bool or a text is a mistake
            number = float(value) if not isinstance(value, (bool, str, bytes)) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise EnvCodeError(
                f"{where} returned {name}={value!r}; rewards must be finite numbers "
                "(a NaN or inf would make every advantage of its group NaN)"
            )
        setattr(result, name, number)
    result.info = _json_safe(result.info or {}, where)
    return result


def _checked_messages(messages: Any, where: str) -> list[Message]:
    """The messages, checked; an empty list is allowed: the agent does not act now."""
    ok = isinstance(messages, (list, tuple)) and all(
        isinstance(m, Mapping)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
        for m in messages
    )
    if not ok:
        raise EnvCodeError(
            f"{where} returned {str(messages)[:200]!r}; observe() must return a list of "
            '{"role": str, "content": str} messages (an empty one: the agent does not act now)'
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class EnvHost:
    def __init__(
        self,
        registry: Registry,
        *,
        sandbox: Sandbox | None = None,
        store: EpisodeStore | None = None,
    ):
        self.registry, self.sandbox = registry, sandbox
        self.store = store if store is not None else EpisodeStore()  # an empty store is falsy

    def _make(self, name: str, options: Mapping[str, Any] | None) -> Environment:
        cls = self.registry.get(name)
        with env_code(f"{_named(name, cls)}: {cls.__name__}(options)"):
            try:
                env = cls(options or {})
            except (TypeError, ValueError, KeyError) as err:  # what an options check raises
                raise InvalidArgument(
                    f"env {name!r} could not be built with options {dict(options or {})}: "
                    f"{type(err).__name__}: {err}"
                ) from None
        if not isinstance(getattr(env, "spec", None), EnvSpec):
            raise EnvCodeError(
                f"{_named(name, cls)}: {cls.__name__}.__init__ must set self.spec = EnvSpec(...)"
            )
        env.sandbox = self.sandbox
        return env

    def describe(self, name: str, options: Mapping[str, Any] | None = None) -> EnvSpec:
        return self._make(name, options).spec

    def list_envs(self) -> list[EnvSpec]:
        return [self.describe(n) for n in self.registry.names()]

    def list_tasks(
        self,
        name: str,
        split: str,
        offset: int = 0,
        limit: int = 0,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[list[str], int]:
        env = self._make(name, options)
        if split not in env.spec.splits:
            raise InvalidArgument(
                f"env {name!r} has no split {split!r}; it has {list(env.spec.splits)}"
            )
        with env_code(f"{_named(name, env)}: task_ids({split!r})"):
            ids = env.task_ids(split)
        if ids is None:
            return [], -1
        end = len(ids) if limit <= 0 else offset + limit
        return list(ids[offset:end]), len(ids)

    async def reset(
        self,
        name: str,
        task_id: str,
        seed: int,
        split: str,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[str, EnvSpec]:
        env = self._make(name, options)
        if split not in env.spec.splits:
            raise InvalidArgument(
                f"env {name!r} has no split {split!r}; it has {list(env.spec.splits)}"
            )
        with env_code(f"{_named(name, env)}: reset({task_id!r}, {seed}, {split!r})"):
            await _maybe_await(env.reset(task_id, seed, split))
        (episode,) = self.store.add(name, env)
        metrics.episode_started(name)
        return episode.id, env.spec

    def _agent(self, episode: Episode, agent: str) -> None:
        if agent not in episode.env.spec.agents:
            raise InvalidArgument(
                f"env {episode.env_name!r} has no agent {agent!r}; "
                f"its agents are {list(episode.env.spec.agents)}"
            )

    async def observe(self, episode_id: str, agent: str) -> tuple[list[Message], int]:
        episode = self.store.get(episode_id)
        self._agent(episode, agent)
        where = f"{_named(episode.env_name, episode.env)}: observe({agent!r})"
        async with episode.lock:
            with env_code(where):
                messages = _checked_messages(await _maybe_await(episode.env.observe(agent)), where)
            if not messages:
                if episode.env.spec.parallel:
                    raise EnvCodeError(
                        f"{where} returned no messages: in a parallel turn every agent acts on the "
                        "turn's start, so none can be skipped; skip agents in sequential turns only"
                    )
                # Nothing to say: the driver skips the agent, and the turn counts it as done.
                turn = episode.turn
                episode.skip(agent)
                return [], turn
        return messages, episode.turn

    async def demonstration(self, episode_id: str, agent: str) -> str | None:
        """The env's own right answer for `agent` now (Environment.demonstration), or None where
        it has none: what `atgrpo model demos` plays; never called in training."""
        episode = self.store.get(episode_id)
        self._agent(episode, agent)
        where = f"{_named(episode.env_name, episode.env)}: demonstration({agent!r})"
        method = getattr(episode.env, "demonstration", None)
        if method is None:  # an env written against an SDK without it
            return None
        async with episode.lock:
            with env_code(where):
                text = await _maybe_await(method(agent))
        if text is not None and not isinstance(text, str):
            raise EnvCodeError(f"{where} returned {type(text).__name__}; return a str or None")
        return text

    async def step(self, episode_id: str, agent: str, action: str) -> StepResult:
        episode = self.store.get(episode_id)
        self._agent(episode, agent)
        if len(action) > MAX_ACTION_CHARS:
            raise InvalidArgument(
                f"action is {len(action)} characters, over {MAX_ACTION_CHARS}; "
                "cap the agent's max_tokens"
            )
        async with episode.lock:
            if episode.done:
                raise FailedPrecondition(f"episode {episode_id} is done; Reset a new one")
            where = f"{_named(episode.env_name, episode.env)}: step({agent!r}, ...)"
            with metrics.STEP_SECONDS.labels(episode.env_name).time(), env_code(where):
                result = await _off_loop(episode.env.step, agent, action)
            result = _checked_result(result, where)
            metrics.judged(episode.env_name, result.info)
            result.turn = episode.advance(agent)
            # Past its spec's max_turns an episode is over even if the env did not say so; the
            # caller learns it here, not from a refused next step.
            episode.done = result.done = (
                bool(result.done) or episode.turn >= episode.env.spec.max_turns
            )
        return result

    async def step_many(self, steps: Sequence[tuple[str, str, str]]) -> list[StepResult]:
        """(episode_id, agent, action) each, concurrently; the results in order."""
        if len(steps) > MAX_FORK:
            raise InvalidArgument(f"{len(steps)} steps in one call, over {MAX_FORK}; split them")
        return list(await asyncio.gather(*(self.step(*s) for s in steps)))

    async def fork(self, episode_id: str, n: int) -> list[str]:
        if not 1 <= n <= MAX_FORK:
            raise InvalidArgument(f"fork count {n} must be between 1 and {MAX_FORK}")
        episode = self.store.get(episode_id)
        async with episode.lock:
            with (
                metrics.FORK_SECONDS.labels(episode.env_name).time(),
                env_code(f"{_named(episode.env_name, episode.env)}: fork()"),
            ):
                copy = await _maybe_await(episode.env.fork())
                forks = self.store.add(
                    episode.env_name, copy, turn=episode.turn, acted=episode.acted, count=n
                )
        for f in forks:
            f.done = episode.done
        return [f.id for f in forks]

    def close(self, episode_ids: Sequence[str]) -> int:
        return self.store.remove(list(episode_ids))

    async def expire_forever(self, every_s: float = 30.0) -> None:
        """Reclaim abandoned episodes in the background."""
        while True:
            await asyncio.sleep(every_s)
            self.store.expire()

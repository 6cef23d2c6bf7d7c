"""One run of an agent program (atgrpo.sdk.program): started, paused at each model call until the
env answers it, and stopped when its episode closes.

An `async def` program runs as a task on the env service's event loop, with an AsyncOpenAI client;
a plain `def` one on a thread of its own (it blocks on each call, and must not block the loop),
with an OpenAI client. Both clients reach the process's interception server (intercept.py),
which hands each call to this run on the run's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import random
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atgrpo.contract.env import Message
from atgrpo.sdk import intercept
from atgrpo.sdk.env import Sandbox, task_rng
from atgrpo.sdk.intercept import CallRefused
from atgrpo.sdk.program_checks import checked_reward

# The program's client waits for each answer while the policy generates it, which can take minutes
# on a CPU; closing the episode answers the call at once, so this bound is only a backstop.
CLIENT_TIMEOUT_S = 3600.0
# Calls one run may have waiting at once: a gather over the roles needs a few; thousands would be
# a runaway loop, each holding a connection of the process's one interception server.
MAX_PENDING_CALLS = 64


class ProgramError(Exception):
    """The program broke the contract (a refused call, a bad reward): the episode ends with it."""


class ProgramStopped(Exception):
    """Answers a pending call of a run whose episode was closed."""


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Never used on the loopback's plain HTTP; httpx builds one per client unless given one."""
    return ssl.create_default_context()


@dataclass(eq=False)
class Call:
    """A model call the program waits on: `role` (the call's model) and the messages it sent."""

    role: str
    messages: list[Message]
    seq: int  # arrival order within the run
    answer: asyncio.Future


class _BlockingSandbox:
    """The sandbox client for a program on a thread: the same methods, blocking until done."""

    def __init__(self, sandbox: Sandbox, loop: asyncio.AbstractEventLoop):
        self._sandbox, self._loop = sandbox, loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._sandbox, name)

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop).result()

        return blocking


class Task:
    """What a program gets with its client: the task (`id`, `seed`, `split`, `data`), `rng` (a
    random.Random drawn from the task's split and seed: the same in every run), `sandbox` (the
    SDK's sandbox client, for code the program runs; blocking in a plain `def` program; None
    without a sandbox service), `base_url` (the interception's OpenAI base URL, for frameworks
    that take one) and `reward(role, value)`."""

    def __init__(self, id: str, seed: int, split: str, data: Any, run: ProgramRun, sandbox: Any):
        self.id, self.seed, self.split, self.data = id, seed, split, data
        self.rng: random.Random = task_rng(split, seed)
        self.sandbox, self.base_url, self._run = sandbox, run.base_url, run

    def reward(self, role: str, value: float) -> None:
        """Give `role` a local reward now: it is paid at the step of `role` the program is in
        (the one whose answer it just got), or at that role's next step."""
        self._run.reward(role, value)


class ProgramRun:
    """One execution of `program(task, client)`. Create and drive it on the env's event loop."""

    def __init__(
        self,
        program: Callable[..., Any],
        task: tuple[str, int, str, Any],
        *,
        roles: tuple[str, ...],
        sandbox: Sandbox | None,
        settle_s: float,
        ignore_upto: int,
    ):
        self.loop = asyncio.get_running_loop()
        self.roles, self.settle_s = roles, settle_s
        self.pending: list[Call] = []
        self.answered = 0  # calls answered so far
        # Rewards given after `answered` answers, for answered > ignore_upto: earlier ones were
        # paid by the run this one replays.
        self.ignore_upto = ignore_upto
        self.rewards: dict[str, float] = {}
        self.refused = ""
        self.finished: asyncio.Future = self.loop.create_future()  # (value, exception)
        self.closed = False
        self._changed = asyncio.Event()
        self._last_arrival = 0.0
        self._seq = itertools.count()
        self._loop_thread = threading.get_ident()
        self.base_url, self._token = intercept.register(self)
        asynchronous = inspect.iscoroutinefunction(program)
        if sandbox is not None and not asynchronous:
            sandbox = _BlockingSandbox(sandbox, self.loop)
        self.task = Task(*task, run=self, sandbox=sandbox)
        self._job: asyncio.Task | None = None
        if asynchronous:
            self._job = self.loop.create_task(self._main_async(program))
        else:
            threading.Thread(
                target=self._main_thread, args=(program,), name="atgrpo-program", daemon=True
            ).start()

    # ---- the program's side -----------------------------------------------------------------

    def _client_args(self, http_client: Any) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "api_key": "atgrpo",
            "max_retries": 0,  # a retried call would be a second, unrecorded turn
            "timeout": CLIENT_TIMEOUT_S,
            # A client of its own per run (the program may close it), with one TLS context for
            # all: loading the CA bundle was 30 ms of every run, and a replay is a run.
            "http_client": http_client(verify=_tls_context()),
        }

    async def _main_async(self, program: Callable[..., Any]) -> None:
        import openai

        client = openai.AsyncOpenAI(**self._client_args(openai.DefaultAsyncHttpxClient))
        try:
            try:
                value = await program(self.task, client)
            finally:  # before the run says it finished: closing it then would cancel this
                await client.close()
        except BaseException as err:
            self._finish(None, err)
            if not isinstance(err, Exception):  # cancelled: the episode closed
                raise
        else:
            self._finish(value, None)

    def _main_thread(self, program: Callable[..., Any]) -> None:
        import openai

        value, error = None, None
        with openai.OpenAI(**self._client_args(openai.DefaultHttpxClient)) as client:
            try:
                value = program(self.task, client)
            except BaseException as err:  # noqa: BLE001 - reported as the episode's error
                error = err
        self._on_loop(self._finish, value, error)

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """fn(*args) on the run's loop, in order with the calls the program makes after it."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                self.loop.call_soon_threadsafe(fn, *args)

    def _finish(self, value: Any, error: BaseException | None) -> None:
        if not self.finished.done():
            self.finished.set_result((value, error))
        self._changed.set()

    def reward(self, role: str, value: Any) -> None:
        try:
            if role not in self.roles:
                raise ValueError(
                    f"task.reward({role!r}, ...): {role!r} is not a role that acts; the roles "
                    f"are {list(self.roles)}"
                )
            number = checked_reward(value, f"task.reward({role!r}, ...)'s value")
        except ValueError as err:
            self._on_loop(self.refuse, str(err))
            raise
        self._on_loop(self._add_reward, role, number)

    def _add_reward(self, role: str, value: float) -> None:
        if self.answered > self.ignore_upto:
            self.rewards[role] = self.rewards.get(role, 0.0) + value

    # ---- the interception server's side (on the run's loop) ----------------------------------

    async def submit(self, model: str, messages: list[Message]) -> tuple[str, int]:
        """Wait for the answer to one call: (text, the call's index in the run)."""
        if self.closed:
            raise ProgramStopped("the episode was closed")
        if model not in self.roles:
            why = (
                f"the program called model {model!r}: a call's model names the role that "
                f"answers, one of {list(self.roles)}"
            )
            self.refuse(why)
            raise CallRefused(why)
        if len(self.pending) >= MAX_PENDING_CALLS:
            why = (
                f"the program has {len(self.pending)} calls waiting at once, the cap is "
                f"{MAX_PENDING_CALLS}: make calls one at a time, or a few together"
            )
            self.refuse(why)
            raise CallRefused(why)
        call = Call(model, messages, next(self._seq), self.loop.create_future())
        self.pending.append(call)
        self._last_arrival = self.loop.time()
        self._changed.set()
        try:
            return await call.answer
        finally:
            if call in self.pending:
                self.pending.remove(call)

    def refuse(self, why: str) -> None:
        self.refused = self.refused or why
        self._changed.set()

    # ---- the env's side -----------------------------------------------------------------------

    async def next_event(self, expect: tuple[str, list[Message]] | None = None) -> Call | None:
        """The call the program waits on now, or None once it returned (see `finished`).

        Calls issued together (asyncio.gather over roles) arrive in any order, so the run waits
        until none arrived for settle_s, then serves the first by role in turn order, then by
        arrival. Replaying, it serves the call it `expect`s as soon as that one is there."""
        while True:
            if self.refused:
                raise ProgramError(self.refused)
            if self.pending:
                if expect is not None:
                    for call in self.pending:
                        if (call.role, call.messages) == expect:
                            return call
                wait = self.settle_s - (self.loop.time() - self._last_arrival)
                if wait <= 0:
                    return min(self.pending, key=lambda c: (self.roles.index(c.role), c.seq))
                await asyncio.sleep(wait)
                continue
            if self.finished.done():
                return None
            self._changed.clear()
            await self._changed.wait()

    def answer(self, call: Call, text: str) -> None:
        self.pending.remove(call)
        index, self.answered = self.answered, self.answered + 1
        if not call.answer.done():  # the program may have hung up
            call.answer.set_result((text, index))

    def drain(self) -> dict[str, float]:
        """The rewards given since the last drain."""
        rewards, self.rewards = self.rewards, {}
        return rewards

    def close(self) -> None:
        """Stop the program: its pending calls fail, an async program is cancelled, and a thread
        gets an error from its next call (a thread cannot be killed: one that never calls the
        model again runs on, unseen, until it returns)."""
        self.closed = True
        intercept.unregister(self._token)
        for call in self.pending:
            if not call.answer.done():
                call.answer.set_exception(ProgramStopped("the episode was closed"))
        self.pending = []
        if self._job is not None and not self.finished.done():
            self._job.cancel()

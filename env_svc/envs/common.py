"""What the built-in environments share, written once.

- `TeamTurns`: the turns of a team whose agents each act once a turn in `spec.turn_order` (math,
  code, reasoning_gym): the constructor's spec and `failure_reward` from the options, the history
  a turn leaves, the prompt skeleton (`_prompt`; the planning envs use `user_prompt`), and
  `step`'s checks around the agent's own step. `ToolTurns` adds the tool agent's run and its
  report to the others (math, reasoning_gym).
- The tool agent's program run in the sandbox (`run_tool`, `sandbox_call`) and its limits
  (`TOOL_LIMITS`, `tool_limits`; the planning envs and code's test runs start from them too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atgrpo.contract.sandbox import Limits
from atgrpo.errors import AtgrpoError, FailedPrecondition, InvalidArgument
from atgrpo.sdk.env import EVAL_SEED_OFFSET, EnvSpec, Message, StepResult
from env_svc import datasets
from env_svc.envs._text import clip, decode, program_lines, run_failure
from env_svc.envs.answer_extract import extract_code

FAILURE_REWARD = -1.0  # what a malformed answer earns in every built-in env, unless an option says
HISTORY_TURNS = 6  # earlier turns a prompt shows (the most recent ones)
CODE_CHARS, STDOUT_CHARS, STDERR_CHARS = 1500, 800, 400  # of a tool program, in the prompts
SANDBOX_WAIT_S = 300.0  # how long a step waits for a busy or restarting sandbox

# A tool agent's program: `tool_timeout_s` (default 5) of wall and CPU time replaces the timeouts.
TOOL_LIMITS = Limits(
    wall_timeout_ms=5000,
    cpu_time_ms=5000,
    memory_bytes=512 * 2**20,
    max_output_bytes=64 * 2**10,
    max_processes=16,
    max_file_bytes=2**20,
    max_open_files=64,
)


def tool_limits(options: Mapping[str, Any], env: str) -> Limits:
    """TOOL_LIMITS with the `tool_timeout_s` option (seconds, default 5) as wall and CPU time."""
    timeout_s = options.get("tool_timeout_s", 5.0)
    timeout_ms = int(float(timeout_s) * 1000)
    if timeout_ms <= 0:
        raise ValueError(f"{env}: tool_timeout_s must be > 0, got {timeout_s}")
    return dataclasses.replace(TOOL_LIMITS, wall_timeout_ms=timeout_ms, cpu_time_ms=timeout_ms)


def turn_options(
    options: Mapping[str, Any], agents: tuple[str, ...], name: str
) -> tuple[tuple[str, ...], bool]:
    """The agents that act, in order (`turn_order`, default `agents`), and `parallel`."""
    order = tuple(options.get("turn_order") or agents)
    if not order or len(set(order)) != len(order) or not set(order) <= set(agents):
        raise ValueError(
            f"{name}: turn_order {list(order)} must list some of {list(agents)}, each once"
        )
    return order, bool(options.get("parallel", False))


def choice_option(
    options: Mapping[str, Any], key: str, default: str, choices: tuple[str, ...], env: str
) -> str:
    """Option `key`: one of `choices`."""
    value = str(options.get(key, default))
    if value not in choices:
        raise ValueError(f"{env}: {key} must be {' or '.join(map(repr, choices))}, got {value!r}")
    return value


def pick_problem(
    kind: str, sources: Mapping[str, datasets.Source], task_id: str, seed: int, split: str
) -> Any:
    """The problem of a task (math, code) from its split's dataset."""
    try:
        problems = datasets.load(kind, sources[split], split)
    except datasets.DatasetError as e:
        raise InvalidArgument(str(e)) from None
    return datasets.pick(problems, task_id, seed, split, EVAL_SEED_OFFSET)


def user_prompt(parts: Iterable[str]) -> list[Message]:
    """A prompt: one user message, its parts apart by a blank line."""
    return [{"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------------------------------------
# The tool agent's program in the sandbox


async def sandbox_call(fn: Any, *args: Any, wait_s: float = SANDBOX_WAIT_S, **kwargs: Any) -> Any:
    """A sandbox call, retried with jittered backoff (the server's retry hint when it gives one)
    while the sandbox is busy or unavailable, for up to `wait_s`: tree sampling sends K branches
    of many tasks at once, more than a sandbox queues, and waiting is the answer to that. Other
    errors, and the last one after `wait_s`, propagate: the episode then fails, so no sample gets
    a reward that no sandbox run computed."""
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        try:
            return await fn(*args, **kwargs)
        except AtgrpoError as e:
            left = deadline - time.monotonic()
            if not e.retryable or left <= 0:
                raise
            hint = e.retry_after_ms / 1000 if e.retry_after_ms else 0.05 * 2 ** min(attempt, 6)
            attempt += 1
            await asyncio.sleep(min(left, min(hint, 5.0) * (0.5 + random.random())))


@dataclass
class ToolRun:
    """A tool agent's program run in the sandbox (math and reasoning_gym's tool agents)."""

    out: dict[str, Any]  # code, stdout, stderr (clipped, for the prompts), answer, error
    info: dict[str, Any]  # the step's info so far (the sandbox's verdict)
    stdout: str = ""  # the whole decoded stdout, to read an answer from
    failure: tuple[str, str] | None = None  # (info key, message): no code block, a refusal, a crash


def read_result(
    result: Any, out: dict[str, Any], info: dict[str, Any], stdout_chars: int = STDOUT_CHARS
) -> tuple[str, str | None]:
    """A finished sandbox run into the prompts' `out` (clipped stdout and stderr) and the step's
    `info` (the verdict): the whole decoded stdout, and what went wrong if anything did."""
    stdout, stderr = decode(getattr(result, "stdout", b"")), decode(getattr(result, "stderr", b""))
    out["stdout"], out["stderr"] = (
        clip(stdout.strip(), stdout_chars),
        clip(stderr.strip(), STDERR_CHARS),
    )
    info["verdict"] = getattr(
        getattr(result, "verdict", None), "value", str(getattr(result, "verdict", ""))
    )
    return stdout, run_failure(result, stderr)


async def run_tool(action: str, sandbox: Any, limits: Limits, env: str) -> ToolRun:
    """The ```python block of `action` run in the sandbox, what the prompts show of it, and why it
    failed if it did (the caller rewards that with its failure_reward)."""
    run = ToolRun({"code": "", "stdout": "", "stderr": "", "answer": None, "error": ""}, {})
    code = extract_code(action)
    if code is None:
        run.failure = (
            "parse_error",
            "no ```python code block found; put the program in one ```python ... ``` block",
        )
        return run
    run.out["code"] = clip(code.strip(), CODE_CHARS)
    if sandbox is None:
        raise FailedPrecondition(
            f"the {env} env's tool agent runs code, but no sandbox is configured: start "
            "env_svc with --sandbox HOST:PORT (local mode does this)"
        )
    try:
        result = await sandbox_call(sandbox.execute, code, limits=limits)
    except InvalidArgument as e:  # the program itself is unacceptable (e.g. a NUL byte)
        run.failure = ("exec_error", f"the sandbox refused the program: {e}")
        return run
    run.stdout, failure = read_result(result, run.out, run.info)
    if failure:
        run.failure = ("exec_error", failure)
    return run


# ---------------------------------------------------------------------------------------------
# A team's turns


class TeamTurns:
    """The turns of a team environment (math, code, reasoning_gym): each agent of
    `spec.turn_order` acts once a turn; what each did (`notes`, via `_record`) becomes the turn's
    history line. A subclass calls `_start_team` in its `__init__` and `_start_turns` in its
    `reset`, and implements `_ready`, `_act` and `_team`."""

    name: str
    options: dict[str, Any]
    spec: EnvSpec
    notes: dict[str, str]
    history: list[str]
    acted: set[str]
    turn: int
    done: bool
    success: bool
    failure_reward: float

    def _start_team(self, agents: tuple[str, ...], max_turns: int, description: str) -> None:
        """From the options: the spec (the agents of `turn_order`, default `agents`; `max_turns`,
        default `max_turns`; `parallel`) and `failure_reward`; no turns yet."""
        order, parallel = turn_options(self.options, agents, self.name)
        self.spec = EnvSpec(
            self.name,
            agents=order,
            turn_order=order,
            max_turns=int(self.options.get("max_turns", max_turns)),
            parallel=parallel,
            description=description,
        )
        self.failure_reward = float(self.options.get("failure_reward", FAILURE_REWARD))
        self._start_turns()

    def _start_turns(self) -> None:
        self.turn, self.acted, self.history, self.notes = 0, set(), [], {}

    def _ready(self) -> bool:
        """Whether reset() has given the episode its task."""
        raise NotImplementedError

    async def _act(self, agent: str, action: str) -> StepResult:
        """`agent`'s step proper: its reward, and a `_record` of what it did."""
        raise NotImplementedError

    def _team(self) -> float:
        """The team reward now."""
        raise NotImplementedError

    async def step(self, agent: str, action: str) -> StepResult:
        self._check(agent)
        if not self._ready():
            raise RuntimeError(f"{self.name}: step() before reset()")
        if self.done:
            return StepResult(
                self._team(), 0.0, True, self.success, {"error": "the episode is over"}
            )
        result = await self._act(agent, action if isinstance(action, str) else "")
        self.acted.add(agent)
        if self.acted >= set(self.spec.turn_order):
            self._end_turn()
        return result

    def _prompt(self, role: str, body: Sequence[str], tail: Sequence[str]) -> list[Message]:
        """The prompt skeleton: the role and the turn, the task (`body`), the history, then what
        this agent is asked (`tail`)."""
        parts = [f"{role}\nTurn {self.turn + 1} of {self.spec.max_turns}.", *body]
        if self.history:
            parts.append("Previous turns:\n" + "\n".join(self.history[-HISTORY_TURNS:]))
        return user_prompt([*parts, *tail])

    def _record(self, agent: str, text: str) -> None:
        self.notes[agent] = text

    def _failed(self, agent: str, note: str, info: dict[str, Any]) -> StepResult:
        """A step that earns `failure_reward` (no answer, or one that could not be run or judged);
        `note` is what the history says the agent did."""
        self._record(agent, note)
        return StepResult(self._team(), self.failure_reward, False, False, info)

    def _end_turn(self) -> None:
        line = "; ".join(f"{a} {self.notes[a]}" for a in self.spec.turn_order if a in self.notes)
        self.history.append(f"Turn {self.turn + 1}: {line}")
        self.notes, self.acted = {}, set()
        self.turn += 1

    def _check(self, agent: str) -> None:
        if agent not in self.spec.agents:
            raise ValueError(
                f"{self.name}: unknown agent {agent!r}; this environment's agents are "
                f"{self.spec.agents}"
            )


class ToolTurns(TeamTurns):
    """TeamTurns with a tool agent (math, reasoning_gym): its output this turn (`tool_out`, from
    run_tool) and its report in the others' prompts."""

    tool_out: dict[str, Any] | None
    sandbox: Any
    limits: Limits

    def _start_turns(self) -> None:
        super()._start_turns()
        self.tool_out = None

    def _end_turn(self) -> None:
        super()._end_turn()
        self.tool_out = None

    async def _run_tool(
        self, action: str, read: Callable[[str], str | None], unscored: dict[str, Any]
    ) -> tuple[ToolRun, str] | StepResult:
        """The tool agent's program run (its output kept for the others' prompts) and the answer
        `read` finds in its stdout; or the step's result when there is none: `failure_reward` for
        no program or a failed one, 0 and `unscored` in the info when it printed nothing."""
        run = await run_tool(action, self.sandbox, self.limits, self.name)
        self.tool_out = out = run.out
        if run.failure is not None:
            key, message = run.failure
            out["error"] = run.info[key] = message
            return self._failed("tool", f"failed ({clip(message, 120)})", run.info)
        answer = read(run.stdout)
        if answer is None:
            out["error"] = "the program printed nothing"
            self._record("tool", "printed nothing")
            info = {**run.info, "answer": None, **unscored}
            return StepResult(self._team(), 0.0, False, False, info)
        return run, answer

    def _tool_report(self) -> str:
        out = self.tool_out
        if out is None:
            return "The tool agent has not acted this turn."
        lines = program_lines(out, "Its output", "Its errors")
        lines.append(
            f"The tool agent's answer: {out['answer']}"
            if out["answer"] is not None
            else f"The tool agent gave no answer: {out['error']}"
        )
        return "\n".join(lines)

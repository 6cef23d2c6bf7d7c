"""`math`: a reasoner and a tool agent solve a math problem together (paper §5.3).

Each turn the agents act in `turn_order` (default `("tool", "reasoner")`, sequential: the
reasoner sees the tool agent's program and output of the same turn).

- **tool** writes one ```python block. It runs in the sandbox (no network, the Python standard
  library only); the last non-empty line of its stdout is its answer (`\\boxed{...}` or
  `Answer: ...` on that line are unwrapped). Local reward: +1 when that answer is right, 0 when it
  is wrong or nothing was printed, `failure_reward` (option, default -1) for no code block or a
  program that crashes or runs past `tool_timeout_s` (the reference's +1 / 0 / -1).
- **reasoner** ends its answer with `\\boxed{...}` (the last box counts; a `Final answer: ...`
  line is accepted when there is no box). Local reward: +1 right, 0 wrong, `failure_reward` when
  no answer can be found.
- **team reward** (both agents): 1.0 while the reasoner's latest answer is right, else 0.0. With
  alpha = 1 the reasoner earns 2 x correct and the tool agent own +1/0/-1 + the reasoner's
  correctness: the reference's rewards.
- **done / success**: success = the reasoner's latest answer is right. `done_when: correct` (the
  default) ends the episode when it is; `done_when: agree` ends it when the reasoner's and the
  tool's answers agree mathematically (the reference), scored by correctness all the same. The
  reference's "agree" alone let two agents end an episode with a shared wrong answer; ours never
  pays for that, and by default does not end on it either. Note that under `correct` a second
  turn tells the agents their first answer was wrong (an oracle); evaluate with `max_turns: 1`
  or `done_when: agree` for oracle-free numbers.

Answers are compared as mathematics, not strings (`answers_match`): `1/2` = `0.5` =
`\\frac{1}{2}`, `\\sqrt{8}` = `2\\sqrt{2}`, `(x-1)(x+1)` = `x^2-1`, numbers within a relative
tolerance (`rel_tol`, default 1e-6), intervals `(0, 1]` (brackets must match), unions of
intervals, sets `\\{1, 2\\}` = `{2, 1}` and comma lists in any order, tuples in order, `x = 3` =
`3`, units and `^\\circ` ignored, and text answers compared case-insensitively.

**Safety.** Model text never reaches `eval`, `sympify` or `parse_expr` (which eval). LaTeX is
rewritten by a small scanner, then a whitelist tokenizer (numbers, single-letter variables, a fixed
list of function and constant names, `+ - * / ^ ( ) , !`) and a recursive-descent parser build the
sympy expression node by node. Every operation is checked before sympy runs it: 400 characters
per answer (1,600 before normalising), 300 tokens, nesting depth 50, 32 items a list, 100-digit
literals, exact numbers of at most 20,000 bits (`9^{9^{9^9}}` is refused before it is computed,
not after), roots of numbers of at most 256 bits (sympy factors them), numeric values within
2^-20,000 .. 2^20,000, factorials to 300, binomials to 1,000. Equality is decided by numeric
evaluation, by a bounded evaluator (at fixed sample points when variables occur), never by
sympy's `evalf` or `simplify`, so a check takes milliseconds. An answer the judge refuses (too
long, too large, too deep, undefined like `0/0` or `1/\\infty`) is a format failure:
`failure_reward`, `correct: False`, and `judge_error` (the reason, counted in
`atgrpo_env_judge_errors_total{env,reason}`) and `parse_error` in the info; a reference answer
past the bounds is compared as text. What the judge guarantees is in env_svc/envs/answers.py;
tests/env/test_integrity_math.py tries to break it.

Options: the problem source (`dataset`, `path`, `train`/`eval`, `start`/`stop`; see
env_svc/datasets.py), `max_turns` (4, the reference's), `turn_order` (e.g. `[reasoner]` for a
single-agent L0 run), `parallel`, `done_when`, `failure_reward`, `tool_timeout_s` (5),
`rel_tol`, `abs_tol` (1e-9).
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atgrpo.contract.sandbox import Limits
from atgrpo.errors import AtgrpoError, FailedPrecondition, InvalidArgument
from atgrpo.sdk.env import EVAL_SEED_OFFSET, Environment, EnvSpec, Message, StepResult
from atgrpo.sdk.judge import JudgeError, failure_info
from env_svc import datasets
from env_svc.envs._text import clip as _clip
from env_svc.envs._text import decode as _decode
from env_svc.envs._text import program_lines, run_failure
from env_svc.envs.answer_extract import extract_answer, extract_code, stdout_answer
from env_svc.envs.answers import answers_match, judge_answer

AGENTS = ("tool", "reasoner")
FAILURE_REWARD = -1.0
CODE_CHARS, STDOUT_CHARS, STDERR_CHARS = 1500, 800, 400
SANDBOX_WAIT_S = 300.0  # how long a step waits for a busy or restarting sandbox

# ---------------------------------------------------------------------------------------------
# The environment


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


async def run_tool(action: str, sandbox: Any, limits: Limits | None, env: str) -> ToolRun:
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
    run.out["code"] = _clip(code.strip(), CODE_CHARS)
    if sandbox is None:
        raise FailedPrecondition(
            f"the {env} env's tool agent runs code, but no sandbox is configured: start "
            "env_svc with --sandbox HOST:PORT (local mode does this)"
        )
    kwargs = {} if limits is None else {"limits": limits}
    try:
        result = await sandbox_call(sandbox.execute, code, **kwargs)
    except InvalidArgument as e:  # the program itself is unacceptable (e.g. a NUL byte)
        run.failure = ("exec_error", f"the sandbox refused the program: {e}")
        return run
    run.stdout, stderr = (
        _decode(getattr(result, "stdout", b"")),
        _decode(getattr(result, "stderr", b"")),
    )
    run.out["stdout"], run.out["stderr"] = (
        _clip(run.stdout.strip(), STDOUT_CHARS),
        _clip(stderr.strip(), STDERR_CHARS),
    )
    run.info["verdict"] = getattr(
        getattr(result, "verdict", None), "value", str(getattr(result, "verdict", ""))
    )
    if failure := run_failure(result, stderr):
        run.failure = ("exec_error", failure)
    return run


def tool_limits(options: Mapping[str, Any], env: str) -> Limits:
    """The sandbox limits of a tool agent's program: `tool_timeout_s` (default 5) of wall and CPU
    time, 512 MiB, 64 KiB of output."""
    timeout_ms = int(float(options.get("tool_timeout_s", 5.0)) * 1000)
    if timeout_ms <= 0:
        raise ValueError(f"{env}: tool_timeout_s must be > 0")
    return Limits(
        wall_timeout_ms=timeout_ms,
        cpu_time_ms=timeout_ms,
        memory_bytes=512 * 2**20,
        max_output_bytes=64 * 2**10,
        max_processes=16,
        max_file_bytes=2**20,
        max_open_files=64,
    )


def turn_options(
    options: Mapping[str, Any], agents: tuple[str, ...], name: str
) -> tuple[tuple[str, ...], bool]:
    order = tuple(options.get("turn_order") or agents)
    if not order or len(set(order)) != len(order) or not set(order) <= set(agents):
        raise ValueError(
            f"{name}: turn_order {list(order)} must list some of {list(agents)}, each once"
        )
    return order, bool(options.get("parallel", False))


class ToolTurns:
    """The turn bookkeeping of an environment with a tool agent (math, reasoning_gym): what each
    agent did this turn (`notes`), the history line a turn leaves, the tool's report to the others.
    The environment sets `notes`, `history`, `acted`, `tool_out` and `turn` in its reset."""

    spec: EnvSpec
    notes: dict[str, str]
    history: list[str]
    acted: set[str]
    tool_out: dict[str, Any] | None
    turn: int

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

    def _record(self, agent: str, text: str) -> None:
        self.notes[agent] = text

    def _end_turn(self) -> None:
        line = "; ".join(f"{a} {self.notes[a]}" for a in self.spec.turn_order if a in self.notes)
        self.history.append(f"Turn {self.turn + 1}: {line}")
        self.notes, self.acted, self.tool_out = {}, set(), None
        self.turn += 1


class MathEnv(ToolTurns, Environment):
    """A reasoner and a tool agent solve a math problem; answers are checked as mathematics."""

    name = "math"
    shared_on_fork = (*Environment.shared_on_fork, "limits", "problem", "sources")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        order, parallel = turn_options(self.options, AGENTS, self.name)
        self.spec = EnvSpec(
            self.name,
            agents=order,
            turn_order=order,
            max_turns=int(self.options.get("max_turns", 4)),
            parallel=parallel,
            description="a reasoner and a tool agent solve a math problem",
        )
        self.sources = datasets.sources(self.options, "math")
        self.done_when = str(self.options.get("done_when", "correct"))
        if self.done_when not in ("correct", "agree"):
            raise ValueError(
                f"math: done_when must be 'correct' or 'agree', got {self.done_when!r}"
            )
        self.failure_reward = float(self.options.get("failure_reward", FAILURE_REWARD))
        self.rel_tol = float(self.options.get("rel_tol", 1e-6))
        self.abs_tol = float(self.options.get("abs_tol", 1e-9))
        self.limits = tool_limits(self.options, self.name)
        self.problem: datasets.MathProblem | None = None
        self.turn = 0
        self.acted: set[str] = set()
        self.done = self.success = False
        self.answer: str | None = None  # the reasoner's latest answer (None when refused)
        self.tool_answer: str | None = None  # the tool program's latest answer (None when refused)
        self.tool_out: dict[str, Any] | None = None  # this turn's tool output
        self.history: list[str] = []
        self.notes: dict[str, str] = {}  # this turn's one-line summary per agent

    # ---- Environment ------------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        if importlib.util.find_spec("sympy") is None:
            raise FailedPrecondition(
                "the math env checks answers with sympy, which is not installed: "
                "`pip install sympy` where env_svc runs"
            )
        try:
            problems = datasets.load("math", self.sources[split], split)
        except datasets.DatasetError as e:
            raise InvalidArgument(str(e)) from None
        self.problem = datasets.pick(problems, task_id, seed, split, EVAL_SEED_OFFSET)
        self.turn, self.acted, self.done, self.success = 0, set(), False, False
        self.answer = self.tool_answer = None
        self.tool_out, self.history, self.notes = None, [], {}

    def observe(self, agent: str) -> list[Message]:
        self._check(agent)
        p = self.problem
        assert p is not None
        multi = len(self.spec.turn_order) > 1
        if agent == "tool":
            role = (
                "You are the tool agent of a two-agent math team (you and a reasoner): write a "
                "Python program that computes the answer."
                if multi
                else "Write a Python program that computes the answer."
            )
        else:
            role = (
                "You are the reasoning agent of a two-agent math team (you and a tool agent who "
                "writes programs): give the final answer."
                if multi
                else "Solve the problem."
            )
        parts = [
            f"{role}\nTurn {self.turn + 1} of {self.spec.max_turns}.",
            f"Problem:\n{p.question}",
        ]
        if self.history:
            parts.append("Previous turns:\n" + "\n".join(self.history[-6:]))
        if agent == "tool":
            parts.append(
                "Write the program in one ```python code block. It runs with Python 3 and its "
                "standard library only (fractions, math, itertools ...), without input. Print the "
                "final answer on the last line of the output."
            )
        else:
            if "tool" in self.spec.turn_order:
                parts.append(self._tool_report())
            parts.append(
                "Reason step by step, then give the final answer in \\boxed{}, e.g. "
                "\\boxed{\\frac{3}{4}}."
            )
        return [{"role": "user", "content": "\n\n".join(parts)}]

    async def step(self, agent: str, action: str) -> StepResult:
        self._check(agent)
        if self.problem is None:
            raise RuntimeError("math: step() before reset()")
        if self.done:
            return StepResult(
                self._team(), 0.0, True, self.success, {"error": "the episode is over"}
            )
        action = action if isinstance(action, str) else ""
        result = await (self._tool(action) if agent == "tool" else self._reasoner(action))
        self.acted.add(agent)
        if self.acted >= set(self.spec.turn_order):
            self._end_turn()
        return result

    # ---- agents -----------------------------------------------------------------------------

    async def _matches(self, a: str, b: str) -> bool:
        """answers_match off the event loop: sympy is pure Python, and env_svc serves other
        episodes meanwhile. For two agents' answers (agreement): either may be refused."""
        return await asyncio.to_thread(answers_match, a, b, self.rel_tol, self.abs_tol)

    async def _judge(self, ans: str) -> JudgeError | bool:
        """Whether `ans` is the problem's answer, or the JudgeError that refused it (off the event
        loop, like _matches)."""
        try:
            return await asyncio.to_thread(
                judge_answer, ans, self.problem.answer, self.rel_tol, self.abs_tol
            )
        except JudgeError as e:
            return e

    def _refused(self, agent: str, ans: str, err: JudgeError, info: dict[str, Any]) -> StepResult:
        """A format failure: an answer the judge could not judge (too large, too deep,
        undefined)."""
        self._record(agent, f"gave an answer the judge refused ({err.reason})")
        return StepResult(
            self._team(),
            self.failure_reward,
            False,
            False,
            failure_info(err, **info, answer=_clip(ans, 200), correct=False),
        )

    async def _reasoner(self, action: str) -> StepResult:
        ans = extract_answer(action)
        if ans is None:
            self._record("reasoner", "gave no \\boxed{} answer")
            return StepResult(
                self._team(),
                self.failure_reward,
                False,
                False,
                {
                    "parse_error": "no \\boxed{...} answer found; end with the final answer in "
                    "\\boxed{}"
                },
            )
        verdict = await self._judge(ans)
        if isinstance(verdict, JudgeError):
            self.answer, self.success = None, False
            return self._refused("reasoner", ans, verdict, {})
        correct = verdict
        self.answer, self.success = ans, correct
        info: dict[str, Any] = {"answer": _clip(ans, 400), "correct": correct}
        if self.done_when == "correct":
            self.done = correct
        else:
            agree = self.tool_answer is not None and await self._matches(ans, self.tool_answer)
            info["agree"] = agree
            self.done = agree
        self._record("reasoner", f"answered {_clip(ans, 200)}")
        return StepResult(self._team(), 1.0 if correct else 0.0, self.done, self.success, info)

    async def _tool(self, action: str) -> StepResult:
        run = await run_tool(action, self.sandbox, self.limits, self.name)
        out, info = run.out, run.info
        self.tool_out = out
        if run.failure:
            key, message = run.failure
            out["error"] = info[key] = message
            self._record("tool", f"failed ({_clip(message, 120)})")
            return StepResult(self._team(), self.failure_reward, False, False, info)
        ans = stdout_answer(run.stdout)
        if ans is None:
            out["error"] = "the program printed nothing"
            self._record("tool", "printed nothing")
            return StepResult(
                self._team(), 0.0, False, False, {**info, "answer": None, "correct": False}
            )
        verdict = await self._judge(ans)
        if isinstance(verdict, JudgeError):
            self.tool_answer = None
            out["error"] = str(verdict)
            return self._refused("tool", ans, verdict, info)
        self.tool_answer, correct = ans, verdict
        out["answer"] = _clip(ans, 400)
        info.update(answer=out["answer"], correct=correct)
        self._record("tool", f"printed {_clip(ans, 200)}")
        if self.done_when == "agree" and self.answer is not None and "reasoner" in self.acted:
            agree = await self._matches(ans, self.answer)
            info["agree"] = agree
            self.done = agree
        return StepResult(self._team(), 1.0 if correct else 0.0, self.done, self.success, info)

    # ---- helpers ----------------------------------------------------------------------------

    def _team(self) -> float:
        return 1.0 if self.success else 0.0

    def _check(self, agent: str) -> None:
        if agent not in self.spec.agents:
            raise ValueError(
                f"math: unknown agent {agent!r}; this environment's agents are {self.spec.agents}"
            )

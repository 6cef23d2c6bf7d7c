"""`math`: a reasoner and a tool agent solve a math problem together (paper §5.3).

Each turn the agents act in `turn_order` (default `("tool", "reasoner")`, sequential: the
reasoner sees the tool agent's program and output of the same turn).

- **tool** writes one ```python block. It runs in the sandbox (no network, the Python standard
  library only); the last non-empty line of its stdout is its answer (`\\boxed{...}` or
  `Answer: ...` on that line are unwrapped). Local reward: +1 when that answer is right, 0 when it
  is wrong or nothing was printed, `failure_reward` (option, default -1) for no code block or a
  program that crashes or runs past `tool_timeout_s` (the reference's +1 / 0 / -1).
- **reasoner** ends its answer with `\\boxed{...}` (the last box counts; a `Final answer: ...`
  line is accepted when there is no box). Local reward: +1 for its first right answer of the
  episode, 0 for a wrong one or a right one again, `failure_reward` when no answer can be found.
- **team reward** (both agents): 1.0 in the turn the reasoner's answer first becomes right, else
  0.0. With alpha = 1 the reasoner earns 2 x correct and the tool agent own +1/0/-1 + the
  reasoner's correctness: the reference's rewards. Under `done_when: correct` the first right
  answer ends the episode; under `agree` it goes on until the agents agree, and a right answer
  kept (while the tool disagrees) is paid once, not every turn.
- **done / success**: success = the reasoner's latest answer is right. `done_when: correct` (the
  default) ends the episode when it is; `done_when: agree` ends it when the reasoner's and the
  tool's answers agree mathematically (the reference), scored by correctness all the same. The
  reference's "agree" alone let two agents end an episode with a shared wrong answer; ours never
  pays for that, and by default does not end on it either. Note that under `correct` a second
  turn tells the agents their first answer was wrong (an oracle); evaluate with `max_turns: 1`
  or `done_when: agree` for oracle-free numbers.

Answers are compared as mathematics, not strings (`answers_match`): `1/2` = `0.5` =
`\\frac{1}{2}`, `\\sqrt{8}` = `2\\sqrt{2}`, `(x-1)(x+1)` = `x^2-1`, numbers within a relative
tolerance (`rel_tol`, default 1e-6, relative to the reference; absolute next to an integer; a
reference of 0 takes `abs_tol`, 1e-9), intervals `(0, 1]` (brackets must match), unions of
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
evaluation, by a bounded evaluator (at sample points when variables occur), never by sympy's
`evalf` or `simplify`, so a check takes milliseconds. The sample points are drawn per reference
from a key of the env process, so no answer can be built to vanish at them. An answer the judge
refuses (too long, too large, too deep, undefined like `0/0` or `1/\\infty`) is a format
failure: `failure_reward`, `correct: False`, and `judge_error` (the reason, counted in
`atgrpo_env_judge_errors_total{env,reason}`) and `parse_error` in the info; a reference answer
past the bounds is compared as text. What the judge guarantees is in env_svc/envs/answers.py;
tests/env/test_integrity_math*.py try to break it.

Options: the problem source (`dataset`, `path`, `train`/`eval`, `start`/`stop`; see
env_svc/datasets.py), `max_turns` (4, the reference's), `turn_order` (e.g. `[reasoner]` for a
single-agent L0 run), `parallel`, `done_when`, `failure_reward`, `tool_timeout_s` (5),
`rel_tol`, `abs_tol` (1e-9).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Mapping
from typing import Any

from atgrpo.errors import FailedPrecondition
from atgrpo.sdk.env import Environment, Message, StepResult
from atgrpo.sdk.judge import JudgeError, failure_info
from env_svc import datasets
from env_svc.envs._text import clip as _clip
from env_svc.envs.answer_extract import extract_answer, stdout_answer
from env_svc.envs.answers import answers_match, judge_answer
from env_svc.envs.common import ToolTurns, choice_option, pick_problem, tool_limits

AGENTS = ("tool", "reasoner")
NO_ANSWER = "no \\boxed{...} answer found; end with the final answer in \\boxed{}"


class MathEnv(ToolTurns, Environment):
    """A reasoner and a tool agent solve a math problem; answers are checked as mathematics."""

    name = "math"
    shared_on_fork = (*Environment.shared_on_fork, "limits", "problem", "sources")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        self._start_team(AGENTS, 4, "a reasoner and a tool agent solve a math problem")
        self.sources = datasets.sources(self.options, "math")
        self.done_when = choice_option(
            self.options, "done_when", "correct", ("correct", "agree"), self.name
        )
        self.rel_tol = float(self.options.get("rel_tol", 1e-6))
        self.abs_tol = float(self.options.get("abs_tol", 1e-9))
        self.limits = tool_limits(self.options, self.name)
        self.problem: datasets.MathProblem | None = None
        self.done = self.success = False
        self.solved_turn: int | None = None  # the turn the reasoner was first right in
        self.answer: str | None = None  # the reasoner's latest answer (None when refused)
        self.tool_answer: str | None = None  # the tool program's latest answer (None when refused)

    # ---- Environment ------------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        if importlib.util.find_spec("sympy") is None:
            raise FailedPrecondition(
                "the math env checks answers with sympy, which is not installed: "
                "`pip install sympy` where env_svc runs"
            )
        self.problem = pick_problem("math", self.sources, task_id, seed, split)
        self.done = self.success = False
        self.solved_turn = None
        self.answer = self.tool_answer = None
        self._start_turns()

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
            tail = [
                "Write the program in one ```python code block. It runs with Python 3 and its "
                "standard library only (fractions, math, itertools ...), without input. Print the "
                "final answer on the last line of the output."
            ]
        else:
            role = (
                "You are the reasoning agent of a two-agent math team (you and a tool agent who "
                "writes programs): give the final answer."
                if multi
                else "Solve the problem."
            )
            tail = [self._tool_report()] if "tool" in self.spec.turn_order else []
            tail.append(
                "Reason step by step, then give the final answer in \\boxed{}, e.g. "
                "\\boxed{\\frac{3}{4}}."
            )
        return self._prompt(role, [f"Problem:\n{p.question}"], tail)

    def demonstration(self, agent: str) -> str | None:
        """The reasoner: the problem's reference answer in \\boxed{}; the tool agent has none (a
        program computing an arbitrary problem's answer is not ours to write)."""
        self._check(agent)
        if self.problem is None or self.done or agent != "reasoner":
            return None
        answer = str(self.problem.answer).strip()
        return f"\\boxed{{{answer}}}" if answer else None

    def _ready(self) -> bool:
        return self.problem is not None

    async def _act(self, agent: str, action: str) -> StepResult:
        return await (self._tool(action) if agent == "tool" else self._reasoner(action))

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
        return self._failed(
            agent,
            f"gave an answer the judge refused ({err.reason})",
            failure_info(err, **info, answer=_clip(ans, 200), correct=False),
        )

    async def _reasoner(self, action: str) -> StepResult:
        ans = extract_answer(action)
        if ans is None:
            return self._failed("reasoner", "gave no \\boxed{} answer", {"parse_error": NO_ANSWER})
        verdict = await self._judge(ans)
        if isinstance(verdict, JudgeError):
            self.answer, self.success = None, False
            return self._refused("reasoner", ans, verdict, {})
        correct = verdict
        first = correct and self.solved_turn is None  # paid once: a right answer kept is not new
        if first:
            self.solved_turn = self.turn
        self.answer, self.success = ans, correct
        info: dict[str, Any] = {"answer": _clip(ans, 400), "correct": correct}
        if self.done_when == "correct":
            self.done = correct
        else:
            agree = self.tool_answer is not None and await self._matches(ans, self.tool_answer)
            info["agree"] = agree
            self.done = agree
        self._record("reasoner", f"answered {_clip(ans, 200)}")
        return StepResult(self._team(), 1.0 if first else 0.0, self.done, self.success, info)

    async def _tool(self, action: str) -> StepResult:
        ran = await self._run_tool(action, stdout_answer, {"correct": False})
        if isinstance(ran, StepResult):
            return ran
        run, ans = ran
        out, info = run.out, run.info
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
        """1.0 in the turn the reasoner's answer first became right, while it stays right; never
        again after (under `done_when: agree` the episode goes on until the tool agrees, and a
        right answer repeated turn after turn must not be paid turn after turn)."""
        return 1.0 if self.success and self.solved_turn == self.turn else 0.0

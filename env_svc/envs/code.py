"""`code`: a coder and a unit tester solve a programming problem together (paper §5.2).

Each turn the agents act in `turn_order` (default `("coder", "tester")`, sequential: the tester
sees the coder's program of the same turn, and the coder's next prompt shows how that program did
on the tester's tests). Every program runs in the sandbox (`RunTests`), never in this process.

- **coder** writes one ```python block: a whole program reading stdin (stdin/stdout problems) or
  the requested function / `class Solution` method (function-call problems; a harness calls it
  with each test's arguments and prints the canonical JSON of the result). The last ```python
  block counts (an unlabeled ``` block when none is labeled; text after `</think>` first). Its
  program is run on all the problem's **hidden tests** (a crash, a timeout or a wrong output fails
  that test), and every one decides success. The **paid fraction** leaves out the examples the
  statement shows (code_examples.py: an input and its output shown as one pair) that it passes:
  the pass fraction over the other tests and the examples it fails, so printing the examples
  earns nothing and a program wrong on one is not paid in full. Local reward = the paid
  fraction gained over the episode's previous program (the first program: its fraction), so a
  coder's rewards over an episode add up to its last program's fraction: submitting a correct
  program again, or a worse one and then a better one, earns nothing more. No code block:
  `failure_reward` (option, default -1), the previous program stays.
- **tester** writes test cases, each a `**Test Input:**` and a `**Test Output:**` marker followed
  by a fenced block (function problems: the arguments one JSON value per line, the output one JSON
  value). Its score is validity x discrimination (`info["score"]`). Validity: the distinct tests
  (one per input) that **agree with the reference solution** (the reference program, run in the
  sandbox on the test's input, prints the test's output), over the tests written, so eight copies
  of one test score 1/8. Discrimination: the fraction of the episode's wrong programs (the coder's
  programs that failed a hidden test, the last MAX_WRONG distinct ones) that some valid test fails;
  0 while there is none, so right tests that have met no wrong program score nothing. Local reward
  = the score gained since its previous step, so its rewards over an episode add up to its last
  tests' discrimination at the end of the episode (in the default order it acts after every program
  but one that succeeds and so ends the episode; a sample is scored when its step is, so this is
  how end-of-episode pay reaches its samples). Tests that are right and catch bugs, not tests that
  the coder happens to pass. The reference's tester reward was always 0 because its golden code was
  never set. Where a dataset has no reference solution (LiveCodeBench), a coder program of this
  episode that passed every hidden test serves as one; until there is one the tester's score is 0
  (`info["no_reference"]`). No parsable test: `failure_reward`, the previous tests stay. At most
  `max_tests` (8) tests count.
- **team reward** (both agents): the paid fraction of the coder's current program (0 before it
  has one). With alpha = 1 the coder earns 2 x paid fraction, the reference's reward.
- **done**: never while a hidden test fails. `done_when: success` (the default): when the hidden
  tests all pass. `done_when: tests`: when they pass *and* the tester's current tests are all right
  and the program passes them (the tester must finish its job too). Or after `max_turns` (default
  5, the reference's).
- **success**: the coder's current program passes every hidden test.

HumanEval problems (`dataset: humaneval`) are function problems with their own judge: the coder
completes the prompt (signature + docstring) with a whole function or a body, and the one hidden
test is HumanEval's `check(entry_point)`, run in this service against a proxy whose every call
runs the answer in its own sandboxed process, data in and data out (code_check.py), so the team
reward and success are HumanEval's pass/fail and the answer cannot reach the verdict. The
tester's tests call the function with JSON arguments as for any function problem, judged by the
canonical solution.

Hidden tests run in chunks of 1, 2, 4, ... cases (code_runs.py); after a chunk in which a case ran
past the time limit, the remaining cases are not run and count as failed (`info["not_run"]`), so a
program that hangs costs one time limit, not one per test. Sandbox calls that find the sandbox busy
or down are retried with backoff; if it stays down the step raises and the episode fails (no sample
is scored without a sandbox run). A program the sandbox refuses (e.g. a NUL byte) is scored like a
crash.

Options: the problem source (`dataset`, `path`, `train`/`eval`, `start`/`stop`, `tests`; see
env_svc/datasets.py), `max_turns`, `turn_order`, `parallel`, `done_when`, `failure_reward`,
`case_timeout_s` (per test, default 2), `memory_mb` (512), `max_hidden_tests` (0 = all),
`max_tests` (8), `stop_on_timeout` (true).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from atgrpo.errors import FailedPrecondition
from atgrpo.sdk.env import Environment, Message, StepResult
from atgrpo.sdk.judge import JudgeError, failure_info
from env_svc import datasets
from env_svc.envs._text import clip as _clip
from env_svc.envs.answer_extract import extract_code
from env_svc.envs.code_examples import paid_fraction, shown_examples
from env_svc.envs.code_program import MAX_TESTS, function_case, parse_tests
from env_svc.envs.code_runs import CaseRun, ProgramRuns, TesterTest
from env_svc.envs.common import TOOL_LIMITS, TeamTurns, choice_option, pick_problem

AGENTS = ("coder", "tester")
NO_PROGRAM = (
    "no ```python code block found; answer with the whole program in one ```python ... ``` block"
)
NO_TESTS = (
    "no tests found; write each test as **Test Input:** and **Test Output:** each followed by a "
    "``` fenced block"
)
TEST_CHARS = 400  # per input / output shown in a prompt
CODE_CHARS = 4000
MAX_WRONG = 4  # wrong programs a tester's tests are tried against


class CodeEnv(TeamTurns, ProgramRuns, Environment):
    """A coder and a unit tester solve a programming problem; programs run in the sandbox."""

    name = "code"
    shared_on_fork = (*Environment.shared_on_fork, "limits", "problem", "sources")

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        self._start_team(AGENTS, 5, "a coder and a unit tester solve a programming problem")
        self.sources = datasets.sources(self.options, "code")
        self.done_when = choice_option(
            self.options, "done_when", "success", ("tests", "success"), self.name
        )
        self.max_tests = int(self.options.get("max_tests", MAX_TESTS))
        self.max_hidden = int(self.options.get("max_hidden_tests", 0))
        self.stop_on_timeout = bool(self.options.get("stop_on_timeout", True))
        timeout_ms = int(float(self.options.get("case_timeout_s", 2.0)) * 1000)
        memory = int(self.options.get("memory_mb", 512)) * 2**20
        if timeout_ms <= 0 or memory <= 0 or self.max_tests < 1 or self.max_hidden < 0:
            raise ValueError(
                "code: case_timeout_s and memory_mb must be > 0, max_tests >= 1, max_hidden_tests "
                ">= 0"
            )
        # The tool agent's limits with the per-test time, memory_mb and room for long outputs.
        self.limits = dataclasses.replace(
            TOOL_LIMITS,
            wall_timeout_ms=timeout_ms,
            cpu_time_ms=timeout_ms,
            memory_bytes=memory,
            max_output_bytes=4 * 2**20,
        )
        self.problem: datasets.CodeProblem | None = None
        self.done = self.success = False
        self.code: str | None = None  # the coder's current program (source)
        self.paid = 0.0  # the paid fraction of the current program (the team reward)
        self.tester_paid = 0.0  # the tester's score its steps have been paid so far
        self.wrong: list[str] = []  # distinct programs that failed a hidden test
        self.tests: list[TesterTest] = []  # the tester's current tests
        self.valid: list[bool] | None = None  # per test: agrees with the reference (None: unknown)
        self.runs: list[CaseRun] = []  # the current program on the current tests
        self.reference = ""  # dataset solution, or a program that passed all hidden tests

    # ---- Environment ------------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        self.problem = pick_problem("code", self.sources, task_id, seed, split)
        self.done = self.success = False
        self.code, self.paid, self.tests, self.valid, self.runs = None, 0.0, [], None, []
        self.wrong, self.tester_paid = [], 0.0
        self.reference = self.problem.solution
        self._start_turns()

    def observe(self, agent: str) -> list[Message]:
        self._check(agent)
        p = self.problem
        assert p is not None
        team = "tester" in self.spec.turn_order and "coder" in self.spec.turn_order
        if agent == "coder":
            role = (
                "You are the coder of a two-agent team (you and a unit tester): write a correct "
                "Python 3 solution."
                if team
                else "Write a correct Python 3 solution."
            )
        else:
            role = (
                "You are the unit tester of a two-agent team (you and a coder): write test cases "
                "that a correct solution passes, to catch mistakes in the coder's program."
            )
        tail: list[str] = []
        if self.code is not None:
            tail.append(
                f"The coder's current "
                f"program:\n```python\n{_clip(self.code.strip(), CODE_CHARS)}\n```"
            )
        if self.tests:
            tail.append(self._tests_report())
        if agent == "coder":
            whole = "function" if p.check else "program"
            tail.append(f"Answer with the complete {whole} in one ```python code block.")
        else:
            tail.append(
                f"Write up to {self.max_tests} tests, each as:\n**Test Input:**\n```\n...\n```\n"
                "**Test Output:**\n```\n...\n```"
            )
        return self._prompt(role, [f"Problem:\n{p.statement}", self._io_rules()], tail)

    def _ready(self) -> bool:
        return self.problem is not None

    async def _act(self, agent: str, action: str) -> StepResult:
        if self.sandbox is None:
            raise FailedPrecondition(
                "the code env runs programs, but no sandbox is configured: start env_svc "
                "with --sandbox HOST:PORT (local mode does this)"
            )
        return await (self._coder(action) if agent == "coder" else self._tester(action))

    def _team(self) -> float:
        return self.paid

    # ---- agents -----------------------------------------------------------------------------

    async def _coder(self, action: str) -> StepResult:
        code = extract_code(action)
        if code is None:
            return self._failed("coder", "gave no program", {"parse_error": NO_PROGRAM})
        p = self.problem
        assert p is not None
        examples: tuple[bool, ...] = (False,)
        if p.check:
            try:
                runs = [await self._run_check(code)]
            except JudgeError as e:
                return self._failed(
                    "coder", "wrote a program the judge could not judge", failure_info(e)
                )
        else:
            cases = p.tests[: self.max_hidden] if self.max_hidden else p.tests
            examples = shown_examples(p.statement, cases)
            runs = await self._run(self._program(code), cases, p.compare)
        passed = sum(r.passed for r in runs)
        before = self.paid
        self.code, self.paid = code, round(paid_fraction([r.passed for r in runs], examples), 6)
        self.success = passed == len(runs)  # the examples too
        if not self.success and code not in self.wrong:
            self.wrong = [*self.wrong, code][-MAX_WRONG:]
        if self.success and not self.reference:
            self.reference = code  # a program that passes every hidden test can judge tests
            if self.tests:
                self.valid = [r.passed for r in await self._run_on_tests(code, self.tests)]
        info: dict[str, Any] = {
            "hidden_passed": passed,
            "hidden_total": len(runs),
            "verdicts": _count(r.verdict for r in runs),
        }
        if any(examples) and not all(examples):
            info["examples"] = sum(examples)  # run and required, not paid
        not_run = sum(r.verdict == "not_run" for r in runs)
        if not_run:
            info["not_run"] = not_run
        failing = next(
            (r for r in runs if not r.passed and r.verdict not in ("ok", "not_run")), None
        )
        if failing is not None and failing.stderr.strip():
            info["error"] = _clip(failing.stderr.strip().splitlines()[-1], 200)
        if self.tests:
            await self._run_current_on_tests()
            info["tests_passed"] = sum(r.passed for r in self.runs)
        self.done = self._is_done()
        self._record("coder", f"wrote a program ({self._tests_line()})")
        # Paid what it gained: the sum over an episode is the last program's paid fraction.
        return StepResult(self.paid, round(self.paid - before, 6), self.done, self.success, info)

    async def _tester(self, action: str) -> StepResult:
        parsed = parse_tests(action, self.max_tests)
        if not parsed:
            return self._failed("tester", "gave no tests", {"parse_error": NO_TESTS})
        p = self.problem
        assert p is not None
        tests, judge_error = [], ""
        for inp, out in parsed:
            t = TesterTest(inp, out)
            if p.kind == "function":
                try:
                    t.stdin, t.expected = function_case(inp, out)
                except JudgeError as e:
                    t.error, judge_error = str(e), e.reason
            else:
                t.stdin, t.expected = inp, out
            tests.append(t)
        self.tests = tests
        info: dict[str, Any] = {"tests": len(tests)}
        malformed = [t.error for t in tests if t.error]
        if malformed:
            info["malformed"] = len(malformed)
            info["parse_error"] = (
                f"{len(malformed)} test(s) are not JSON values: {_clip(malformed[0], 120)}"
            )
            info["judge_error"] = judge_error
        score = 0.0
        if self.reference:
            runs = await self._run_on_tests(self.reference, tests)
            self.valid = [r.passed for r in runs]
            info["agree"] = sum(self.valid)
            score, info["caught"] = await self._tester_score(tests, self.valid)
            info["score"] = score
        else:
            self.valid = None
            info["no_reference"] = True
        # Paid what its score gained: the sum over an episode is its last tests' score against
        # the episode's wrong programs, however often it rewrites them.
        local, self.tester_paid = round(score - self.tester_paid, 6), score
        if self.code is not None:
            await self._run_current_on_tests()
            info["code_passed"] = sum(r.passed for r in self.runs)
        else:
            self.runs = []
        self.done = self._is_done()
        self._record("tester", f"wrote {len(tests)} tests")
        return StepResult(self.paid, local, self.done, self.success, info)

    # ---- running programs -------------------------------------------------------------------

    async def _tester_score(self, tests: list[TesterTest], valid: list[bool]) -> tuple[float, int]:
        """validity x discrimination (module docstring), and how many wrong programs were caught;
        0 before there is a wrong program to catch."""
        seen: set[str] = set()
        distinct = []  # one valid test per input: copies add nothing
        for t, ok in zip(tests, valid, strict=True):
            key = " ".join(t.stdin.split())
            if ok and key not in seen:
                seen.add(key)
                distinct.append(t)
        if not self.wrong or not distinct:
            return 0.0, 0
        validity = len(distinct) / len(tests)
        caught = 0
        for program in self.wrong:
            caught += not all(r.passed for r in await self._run_on_tests(program, distinct))
        return round(validity * caught / len(self.wrong), 6), caught

    async def _run_current_on_tests(self) -> None:
        assert self.code is not None
        self.runs = await self._run_on_tests(self.code, self.tests)

    def _is_done(self) -> bool:
        if not self.success or self.done_when == "success":  # never ends while a hidden test fails
            return self.success
        if self.code is None or not self.tests or len(self.runs) != len(self.tests):
            return False
        tests_right = (
            all(self.valid) if self.valid is not None else all(not t.error for t in self.tests)
        )
        return tests_right and all(r.passed for r in self.runs)

    # ---- prompts ----------------------------------------------------------------------------

    def _io_rules(self) -> str:
        p = self.problem
        assert p is not None
        if p.check:
            return (
                f"Write the whole function `{p.fn_name}` (with the imports it needs), or only its "
                f"body; "
                "the code above runs first, so its imports and helper functions are there. A "
                "test's input is the arguments, one JSON value per line; its output is the "
                "returned value as JSON."
            )
        if p.kind == "function":
            starter = (
                f"\nStarter code:\n```python\n{p.starter_code.strip()}\n```"
                if p.starter_code.strip()
                else ""
            )
            return (
                f"Implement the function `{p.fn_name}` (a plain function, or a method of `class "
                f"Solution`); it is called with each test's arguments and must return the "
                f"answer.{starter}\n"
                "A test's input is the arguments, one JSON value per line; its output is the "
                "returned value as JSON."
            )
        return "The program reads the input from stdin and prints the answer to stdout."

    def _tests_line(self) -> str:
        if not self.tests or len(self.runs) != len(self.tests):
            return "no tester tests yet"
        return f"passes {sum(r.passed for r in self.runs)} of the tester's {len(self.tests)} tests"

    def _tests_report(self) -> str:
        lines = [
            f"The tester's current tests and how the coder's program does on them "
            f"({self._tests_line()}):"
        ]
        for k, t in enumerate(self.tests, 1):
            lines.append(
                f"Test {k} input:\n{_clip(t.input.rstrip(), TEST_CHARS)}\nexpected output:\n"
                f"{_clip(t.output.rstrip(), TEST_CHARS)}"
            )
            if k - 1 < len(self.runs):
                r = self.runs[k - 1]
                if r.verdict == "malformed":
                    lines.append(f"-> not run: {r.stderr}")
                elif r.passed:
                    lines.append("-> passed")
                elif r.verdict == "ok":
                    lines.append(
                        f"-> failed, the program printed:\n{_clip(r.stdout.rstrip(), TEST_CHARS)}"
                    )
                else:
                    tail = (
                        r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "no error output"
                    )
                    lines.append(f"-> failed ({r.verdict}): {_clip(tail, 200)}")
        return "\n".join(lines)


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out

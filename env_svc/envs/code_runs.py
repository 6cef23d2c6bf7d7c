"""How the code env (code.py) runs programs in the sandbox: the coder's program, a reference or a
wrong program on test cases (`_run`: chunks of 1, 2, 4, ... cases, stopping after a chunk with a
timeout), on the tester's tests (malformed ones fail without running), and HumanEval's
check(entry_point) against a proxy whose every call runs the answer in its own sandboxed process
(code_check.py).

A mixin of CodeEnv, as TeamTurns is (common.py), so that code.py reads as the agents' steps, their
rewards and their prompts.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atgrpo.contract.sandbox import Compare, Limits
from atgrpo.errors import InvalidArgument
from atgrpo.sdk.env import Sandbox
from env_svc import datasets
from env_svc.envs._text import decode as _decode
from env_svc.envs.code_check import (
    Check,
    call_program,
    complete_function,
    gather_chunks,
    harness_outcomes,
    judge,
)
from env_svc.envs.code_program import function_program
from env_svc.envs.common import sandbox_call


@dataclass
class CaseRun:
    passed: bool
    verdict: str  # ok / runtime_error / timeout / ... ; "not_run" when skipped
    stdout: str = ""
    stderr: str = ""


@dataclass
class TesterTest:
    input: str  # as the tester wrote it
    output: str
    stdin: str = ""  # run form
    expected: str = ""
    error: str = ""  # malformed (function problems): why; such a test is not run


class ProgramRuns:
    """CodeEnv's sandbox runs: the problem's programs on cases, within the env's `limits`."""

    problem: datasets.CodeProblem | None
    limits: Limits
    sandbox: Sandbox | None
    stop_on_timeout: bool

    async def _run_check(self, code: str) -> CaseRun:
        """HumanEval's check(entry_point) against `code`, each call in its own sandboxed process."""
        p = self.problem
        assert p is not None
        per_call_s = self.limits.wall_timeout_ms / 1000
        program = call_program(
            complete_function(p.starter_code, code, p.fn_name), p.fn_name, per_call_s
        )

        async def run_chunk(keys: Sequence[str]) -> list[tuple[str, Any]]:
            # The harness times each call itself; the run's own limit covers all of them.
            limits = dataclasses.replace(
                self.limits, wall_timeout_ms=int(1000 * (per_call_s * len(keys) + 2))
            )
            stdin = ("[" + ",".join(keys) + "]").encode()
            try:
                res = await sandbox_call(self.sandbox.execute, program, stdin=stdin, limits=limits)
            except InvalidArgument as e:  # the program itself is unacceptable (a NUL byte)
                return [("error", f"refused: {e}")] * len(keys)
            # Off the event loop: the output is up to the sandbox's limit, and hostile.
            return await asyncio.to_thread(harness_outcomes, res.stdout, res.stderr, len(keys))

        verdict = await judge(
            Check(p.starter_code, p.check, p.fn_name, p.id),
            lambda keys: gather_chunks(keys, run_chunk),
        )
        return CaseRun(verdict.passed, verdict.verdict, "", verdict.error)

    def _program(self, source: str) -> str:
        """The program that runs `source` on the tester's tests (stdin: a test's input)."""
        p = self.problem
        assert p is not None
        if p.check:  # no prelude: HumanEval's own check runs the answer without one
            return function_program(
                complete_function(p.starter_code, source, p.fn_name), p.fn_name, prelude=""
            )
        return function_program(source, p.fn_name) if p.kind == "function" else source

    async def _run(
        self, program: str, cases: Sequence[tuple[str, str]], compare: str = "whitespace"
    ) -> list[CaseRun]:
        """`program` on each (stdin, expected) case; chunks of 1, 2, 4, ... cases, stopping after a
        chunk with a timeout (the rest count as failed, verdict not_run)."""
        if not cases:
            return []
        mode = Compare.FLOAT if compare == "float" else Compare.WHITESPACE
        runs: list[CaseRun] = []
        i, size = 0, 1
        while i < len(cases):
            chunk = cases[i : i + size]
            encoded = [(a.encode(), b.encode()) for a, b in chunk]
            try:
                res = await sandbox_call(
                    self.sandbox.run_tests, program, encoded, compare=mode, limits=self.limits
                )
            except InvalidArgument as e:  # the program itself is unacceptable (e.g. a NUL byte)
                return runs + [CaseRun(False, "refused", "", str(e))] * (len(cases) - i)
            timed_out = False
            for c in res.cases:
                ex = c.execution
                verdict = (
                    getattr(getattr(ex, "verdict", None), "value", "not_run")
                    if ex is not None
                    else "not_run"
                )
                timed_out = timed_out or verdict == "timeout"
                runs.append(
                    CaseRun(
                        bool(c.passed),
                        verdict,
                        _decode(getattr(ex, "stdout", b"")),
                        _decode(getattr(ex, "stderr", b"")),
                    )
                )
            i += len(chunk)
            size *= 2
            if timed_out and self.stop_on_timeout and i < len(cases):
                runs += [CaseRun(False, "not_run")] * (len(cases) - i)
                break
        return runs

    async def _run_on_tests(self, source: str, tests: list[TesterTest]) -> list[CaseRun]:
        """`source` on the tester's tests; malformed ones fail without running."""
        runnable = [(t.stdin, t.expected) for t in tests if not t.error]
        got = iter(await self._run(self._program(source), runnable))
        return [CaseRun(False, "malformed", "", t.error) if t.error else next(got) for t in tests]

"""Judging HumanEval-style problems so that the answer cannot reach the verdict.

HumanEval's own executor runs `prompt + completion + test + check(entry_point)` in one namespace
and passes on no exception. Run that way, the answer can pass without being right: exit before the
check (`os._exit(0)`, an atexit hook), forge the pass line, return an object equal to everything,
patch `compile`, `exec`, `sys.exit`, `abs` or the prompt's helpers, or read the test from disk or
from its caller's frame. So here the two never meet:

- the problem's `check(candidate)` (trusted dataset code, with the prompt's helpers) runs in the
  env service, in a namespace of its own, against a proxy `candidate`;
- each distinct call of the proxy runs the answer in its own sandboxed process (`call_program`),
  its arguments going in and its result coming out as data (call_data.py): the judge compares
  fresh built-in values, and a result that is not plain data is a failed call;
- nothing of the test is in the sandbox, and no exit code or output line means "passed";
- nothing the answer returns can stall the service: results are decoded within bounds (a result
  too large, too deep or hash-colliding to build is a JudgeError: a format failure), copied fresh
  for each use in linear time, and check() runs in a thread, off the event loop, within
  CHECK_BUDGET_S.

The check is sequential (an assert needs its call's result) and the sandbox is best used in
batches, so it is replayed: each probing round runs check() with its asserts made harmless and
the results known so far; a call not yet known records its arguments and gets a placeholder so the
round can find more calls; the calls a round found run in the sandbox together. Each round first
runs the check as written: when every call it makes is known, its outcome is the verdict (a
placeholder never decides anything), so a wrong answer is judged after its first failing call.
As in HumanEval's namespace, the entry point's own name in the check (HumanEval/33 compares
candidate to sort_third) is the candidate. The check's `random` is a generator seeded per problem,
so every round makes the same calls (HumanEval/53 draws its arguments unseeded).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import inspect
import json
import math
import random
import sys
import textwrap
import time
import traceback
import types
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atgrpo.sdk.judge import JudgeError
from env_svc.envs import call_data
from env_svc.envs._text import clip, decode

MAX_CALLS = 512  # distinct candidate calls one check may make (HumanEval's most: ~110)
MAX_ROUNDS = 64
CHUNK = 64  # calls per sandbox run; runs go concurrently over the sandbox's workers
FIRST_BATCH = 8  # calls of the first round; each round doubles it (the harness stops a
# batch at its first call that hangs, so that costs one time limit)
CHECK_FILE = "<check>"
PROMPT_FILE = "<prompt>"
CHECK_BUDGET_S = 10.0  # the check's own running time on one answer, all rounds (HumanEval's: ms)

_HARNESS = '''\
from __future__ import annotations
import io
import json
import os
import select
import signal
import sys
import time
import traceback

{encode}

_TAGS = {{"$tuple": tuple, "$set": set, "$frozenset": frozenset}}


def decode(v):
    if isinstance(v, list):
        return [decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    ((tag, x),) = v.items()
    if tag == "$float":
        return float(x)
    if tag == "$bytes":
        return bytes.fromhex(x)
    if tag == "$complex":
        return complex(*x)
    if tag == "$dict":
        return dict((decode(k), decode(y)) for k, y in x)
    return _TAGS[tag](decode(y) for y in x)


SOURCE = {source!r}
NAME = {name!r}
TIMEOUT_S = {timeout_s!r}
MAX_BYTES = {max_bytes!r}


def child(call, w):
    """Runs the answer (only ever here, in a process of its own) and writes its one result to w."""
    os.dup2(2, 1)                         # the answer's own writes to fd 1 land with its stderr
    sys.stdout = sys.stderr
    sys.stdin = io.StringIO("")
    try:
        ns = {{"__name__": "solution"}}
        exec(compile(SOURCE, "solution.py", "exec"), ns)
        fn = ns.get(NAME)
        if not callable(fn):
            raise NameError(f"the program defines no function {{NAME}}")
        outcome = {{"value": encode(fn(*call[0], **call[1]))}}
    except BaseException as e:           # SystemExit in the function is a failed call too
        traceback.print_exc()
        outcome = {{"error": type(e).__name__}}
    data = json.dumps(outcome, separators=(",", ":"), allow_nan=False).encode()
    while data:
        data = data[os.write(w, data):]
    os._exit(0)


def call(args):
    """One call in a fresh child: its output as text, or None when it ran past TIMEOUT_S."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child(args, w)
    os.close(w)
    out, size, deadline = [], 0, time.monotonic() + TIMEOUT_S
    while size <= MAX_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return None
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        out.append(chunk)
        size += len(chunk)
    os.kill(pid, signal.SIGKILL)          # done (or over MAX_BYTES): nothing more from it
    os.waitpid(pid, 0)
    os.close(r)
    return b"".join(out)[:MAX_BYTES].decode("utf-8", "replace")


def main():
    calls = [decode(c) for c in json.loads(sys.stdin.read())]
    results = []
    for args in calls:
        results.append(call(args))
        if results[-1] is None:          # a call that hangs: the rest are not worth a time limit each
            break
    sys.stdout.write(json.dumps(results))
    sys.stdout.flush()


main()
'''  # noqa: E501


def call_program(source: str, entry_point: str, timeout_s: float, max_bytes: int = 1 << 20) -> str:
    """A program that runs `source` (untrusted: only ever in the sandbox) once per call on its stdin
    (a JSON list of [args, kwargs]), each call in a child process of its own that exits after it,
    and prints a JSON list: per call the child's {"value": result} / {"error": exception name} as
    text, or null when it ran past timeout_s (then the calls after it are not run). The parent
    never runs the answer; the answer can only choose what its own calls return."""
    return _HARNESS.format(
        encode=inspect.getsource(call_data.encode),
        source=source,
        name=entry_point,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
    )


class CandidateError(Exception):
    """The candidate's call failed (raised, crashed, returned non-data): in check() it is what
    the candidate raising would be."""


class _Stop(BaseException):
    """Ends a round early (check's own `except Exception` cannot catch it)."""


class _Refused(BaseException):
    """Carries a JudgeError out of check() past any `except Exception` in the check's own code."""

    def __init__(self, err: JudgeError):
        super().__init__(str(err))
        self.err = err


class _Pending:
    """The stand-in result of a call not made yet: it lets a round go on to find later calls. Its
    answers are arbitrary, and a round that met one decides nothing."""

    def __eq__(self, other: object) -> bool:
        return True

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __eq__

    def __hash__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Any:
        return iter(())

    def __float__(self) -> float:
        return 0.0

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def _same(self, *_: Any) -> _Pending:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = (
        _same
    )
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __getitem__ = _same
    __abs__ = __neg__ = __pos__ = __round__ = _same


@dataclass
class _Round:
    known: dict[str, tuple[str, Any]]  # call key -> ("value", v) | ("error", message)
    missing: list[str] = field(default_factory=list)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        try:
            key = call_data.dumps([list(args), kwargs])
        except (TypeError, ValueError):
            if self.missing:  # built from a placeholder: known next round
                raise _Stop from None
            raise _Refused(
                JudgeError(
                    "check_error",
                    "the check passed the candidate an argument that is not plain data",
                )
            ) from None
        if key in self.known:
            kind, value = self.known[key]
            if kind == "error":
                raise CandidateError(value)
            return call_data.fresh(value)  # check may mutate it; the next call gets it fresh
        if key not in self.missing:
            if len(self.known) + len(self.missing) >= MAX_CALLS:
                raise _Refused(
                    JudgeError("too_many_calls", f"the check makes over {MAX_CALLS} distinct calls")
                )
            self.missing.append(key)
        return _Pending()


def _seeded_random(seed: str) -> types.ModuleType:
    """A `random` module whose functions draw from a generator of their own, seeded by `seed`."""
    rng = random.Random(seed)
    mod = types.ModuleType("random")
    for name in dir(random):
        value = getattr(random, name)
        if getattr(value, "__self__", None) is random._inst:  # randint, choice, shuffle, ...
            value = getattr(rng, name)
        setattr(mod, name, value)
    return mod


@dataclass
class Verdict:
    passed: bool
    verdict: str  # ok / runtime_error / timeout
    error: str = ""
    calls: int = 0


class _SoftAsserts(ast.NodeTransformer):
    """`assert test, msg` -> `__probe__(test)`: a probing round evaluates every assert's test (and
    so makes its calls) without stopping at the first that fails."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        probe = ast.Call(ast.Name("__probe__", ast.Load()), [node.test], [])
        return ast.copy_location(ast.Expr(probe), node)


class Check:
    """A problem's check(candidate), compiled once, replayed against recorded calls."""

    def __init__(self, prompt: str, test: str, entry_point: str, seed: str):
        prompt_code = compile(prompt, PROMPT_FILE, "exec")
        soft = ast.fix_missing_locations(_SoftAsserts().visit(ast.parse(test)))
        self.code = {
            False: (prompt_code, compile(test, CHECK_FILE, "exec")),
            True: (prompt_code, compile(soft, CHECK_FILE, "exec")),
        }
        self.entry_point, self.seed = entry_point, seed

    def replay(
        self, known: dict[str, tuple[str, Any]], probe: bool, budget_s: float = math.inf
    ) -> tuple[list[str], BaseException | None]:
        """One round: the calls it could not answer, and how check() ended (None: it returned).
        JudgeError when it runs past budget_s."""
        rnd = _Round(known)
        fake_random = _seeded_random(self.seed)

        def _import(name: str, *args: Any, **kwargs: Any) -> Any:
            return fake_random if name == "random" else builtins.__import__(name, *args, **kwargs)

        ns: dict[str, Any] = {
            "__name__": "check",
            "__probe__": lambda _: None,
            "__builtins__": {**builtins.__dict__, "__import__": _import},
        }
        outer = sys.gettrace()  # a debugger's or coverage's, given back after
        sys.settrace(_deadline(time.monotonic() + budget_s))
        try:
            for code in self.code[probe]:
                exec(code, ns)
            ns[self.entry_point] = rnd.call
            ns["check"](rnd.call)
        except _Stop:
            return rnd.missing, None
        except _Refused as r:
            raise r.err from None
        except Exception as e:  # an assert or the candidate's failure (or a placeholder)
            return rnd.missing, e
        finally:
            sys.settrace(outer)
        return rnd.missing, None


def _deadline(at: float) -> Any:
    """A trace function (this thread's) that stops a round past `at`: checked at every call, and
    at every line of the check's and the prompt's own code, where a loop over what an answer
    returned would spin. (A long C-level operation is not interrupted: the data is bounded so that
    none is long.)"""

    def tracer(frame: types.FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > at:
            raise _Refused(
                JudgeError("check_timeout", "the check ran past its time on this answer's results")
            )
        return tracer if frame.f_code.co_filename in (CHECK_FILE, PROMPT_FILE) else None

    return tracer


Runner = Callable[[Sequence[str]], Awaitable[list[tuple[str, Any]]]]


async def judge(check: Check, run_calls: Runner, budget_s: float = CHECK_BUDGET_S) -> Verdict:
    """Replay `check` until a round needs no new call; `run_calls(keys)` runs the candidate on each
    call and returns ("value", v) / ("error", message) / ("timeout", message) / ("refused",
    JudgeError) per key. The rounds run in a thread, off the event loop, within budget_s together;
    JudgeError past it, or for a refused result."""
    known: dict[str, tuple[str, Any]] = {}
    left = budget_s

    async def replay(probe: bool) -> tuple[list[str], BaseException | None]:
        nonlocal left
        missing, ended, took = await asyncio.to_thread(_timed, check, known, probe, left)
        left -= took
        return missing, ended

    batch = FIRST_BATCH
    for _ in range(MAX_ROUNDS):
        missing, ended = await replay(probe=False)
        if not missing:
            if ended is None:
                return Verdict(True, "ok", calls=len(known))
            return Verdict(False, "runtime_error", _describe(ended), len(known))
        # The check's next call first, then what a probing round finds after it; batches double,
        # so a wrong answer fails after a few calls and a right one takes a few rounds.
        probed, _ = await replay(probe=True)
        keys = [missing[0], *(k for k in probed if k != missing[0])][:batch]
        batch *= 2
        for key, outcome in zip(keys, await run_calls(keys), strict=True):
            if outcome[0] == "refused":
                raise outcome[1]
            if outcome[0] == "timeout":
                return Verdict(False, "timeout", outcome[1], len(known) + 1)
            known[key] = outcome
    raise JudgeError("too_many_calls", f"the check needed more than {MAX_ROUNDS} rounds of calls")


def _timed(
    check: Check, known: dict[str, tuple[str, Any]], probe: bool, budget_s: float
) -> tuple[list[str], BaseException | None, float]:
    """check.replay and the seconds it took (timed where it runs: not its wait for a thread)."""
    start = time.monotonic()
    missing, ended = check.replay(known, probe, budget_s)
    return missing, ended, time.monotonic() - start


def _describe(err: BaseException) -> str:
    """What failed, without the test's text (the coder sees this): the exception and the check's
    line."""
    line = next(
        (
            f.lineno
            for f in reversed(traceback.extract_tb(err.__traceback__))
            if f.filename == CHECK_FILE
        ),
        None,
    )
    at = f" at line {line} of the check" if line else ""
    what = f"the candidate raised {err}" if isinstance(err, CandidateError) else type(err).__name__
    return f"{what}{at}"


def call_outcome(text: str | None) -> tuple[str, Any]:
    """One call's result from call_program's list, as the judge sees it: a value too large to
    judge is ("refused", JudgeError)."""
    if text is None:
        return "timeout", "a call ran past the time limit"
    try:
        out = json.loads(text) if len(text) <= call_data.MAX_RESULT_CHARS else None
    except (ValueError, RecursionError):
        out = None
    if not isinstance(out, dict) or len(out) != 1:
        return "error", "the call wrote no readable result"
    if "error" in out:
        return "error", str(out["error"])[:80]
    try:
        return "value", call_data.decode_json(out.get("value"))
    except JudgeError as e:
        return ("error", str(e)) if e.reason == "not_data" else ("refused", e)


def harness_outcomes(stdout: bytes, stderr: bytes, n: int) -> list[tuple[str, Any]]:
    """The outcome of each of the n calls of one call_program run (call_outcome's), from its
    output: linear in it, and run off the event loop (it is up to the sandbox's output limit)."""
    try:
        texts = json.loads(decode(stdout))
    except (ValueError, RecursionError):
        texts = None
    lines = decode(stderr).strip().splitlines()
    tail = f" ({clip(lines[-1], 200)})" if lines else ""
    if not isinstance(texts, list) or not all(t is None or isinstance(t, str) for t in texts):
        return [("error", f"the calls' harness failed{tail}")] * n
    out = [call_outcome(t) for t in texts[:n]]
    out = [(kind, f"{what}{tail}") if kind == "error" else (kind, what) for kind, what in out]
    return out + [("error", "not run")] * (n - len(out))


def complete_function(prompt: str, answer: str, entry_point: str) -> str:
    """The source a HumanEval answer makes with its prompt. A full function (a top-level `def
    entry_point`, with or without imports and helpers) follows the prompt and replaces its stub; the
    prompt still runs first, for its imports and the helper functions some problems define there
    (HumanEval/32's poly). Anything else is a body, appended to the prompt as HumanEval does."""
    head = prompt.rstrip() + "\n"
    if _parses(answer) and _defines(answer, entry_point):
        return f"{head}\n\n{answer}"
    text = answer.strip("\n")
    # Re-indented to the function's level; or, for a body whose first line lost its indentation
    # (a stripped completion), that line alone indented. The first of the two that parses.
    bodies = [
        head + textwrap.indent(textwrap.dedent(text), "    ") + "\n",
        head + "    " + text + "\n",
    ]
    return next((b for b in bodies if _parses(b)), bodies[0])


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte
        return False
    return True


def _defines(source: str, name: str) -> bool:
    """`source` (which parses) defines `name` at top level."""
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        for n in ast.parse(source).body
    )


async def gather_chunks(
    keys: Sequence[str], run_chunk: Callable[[Sequence[str]], Awaitable[list[tuple[str, Any]]]]
) -> list[tuple[str, Any]]:
    """`run_chunk` over chunks of CHUNK keys, concurrently, results in order."""
    parts = await asyncio.gather(
        *(run_chunk(keys[i : i + CHUNK]) for i in range(0, len(keys), CHUNK))
    )
    return [o for part in parts for o in part]

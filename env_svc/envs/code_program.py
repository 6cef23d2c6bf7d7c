"""The code env's program and test formats: the harness that runs a function-call solution as a
stdin/stdout program (only ever in the sandbox), and the tester's `**Test Input:**` /
`**Test Output:**` sections parsed into cases."""

from __future__ import annotations

import inspect
import re
from typing import Any

from atgrpo.sdk.judge import literal
from env_svc import code_formats

MAX_TESTS = 8

# Names a LeetCode-style solution expects without importing them (LiveCodeBench's harness does
# the same).
PRELUDE = """\
import bisect, collections, functools, heapq, itertools, math, re, string, sys
from typing import *
from collections import *
from functools import *
from itertools import *
from heapq import *
from bisect import *
from math import inf, gcd, sqrt, ceil, floor, log, log2, comb, factorial, isqrt
"""

_HARNESS = """\
from __future__ import annotations
import io
import json
import sys
import traceback

{canonical}

{canonical_json}

SOURCE = {source!r}
NAME = {name!r}
PRELUDE = {prelude!r}


def main():
    args = [json.loads(line) for line in sys.stdin.read().splitlines() if line.strip()]
    real_stdout = sys.stdout
    sys.stdout = sys.stderr            # the solution's own prints must not look like its result
    sys.stdin = io.StringIO("")
    ns = {{"__name__": "solution"}}
    exec(PRELUDE, ns)
    exec(compile(SOURCE, "solution.py", "exec"), ns)
    cls = ns.get("Solution")
    if isinstance(cls, type) and hasattr(cls, NAME):
        fn = getattr(cls(), NAME)
    elif callable(ns.get(NAME)):
        fn = ns[NAME]
    else:
        print(f"the program defines no function {{NAME}} (nor a class Solution with that method)", file=sys.stderr)
        sys.exit(3)
    result = fn(*args)
    sys.stdout = real_stdout
    print(canonical_json(result))


try:
    main()
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    sys.exit(1)
"""  # noqa: E501


def function_program(source: str, name: str, prelude: str = PRELUDE) -> str:
    """A stdin/stdout program that runs `source` (untrusted: it is only ever run in the sandbox)
    and prints canonical_json(name(*args)) for the arguments on stdin, one JSON value a line."""
    return _HARNESS.format(
        canonical=inspect.getsource(code_formats.canonical),
        canonical_json=inspect.getsource(code_formats.canonical_json),
        source=source,
        name=name,
        prelude=prelude,
    )


# ---------------------------------------------------------------------------------------------
# Parsing the tester's output

# No unbounded quantifier before the literal "test": a search tries every start, and `\s*test` on
# a long run of spaces would scan the rest of the run from each one (quadratic).
_MARK_RE = re.compile(
    r"(?:(?:\*\*|__)[ "
    r"\t]{0,8})?test\s*(input|output)\s*(?:#?\s*\d+)?\s*(?:\*\*|__)?\s*[:：]?\s*(?:\*\*|__)?",
    re.IGNORECASE,
)
_FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _segment_text(segment: str) -> str | None:
    """The test data in the text after a marker: its first fenced block, else the text itself
    up to a blank line."""
    fence = _FENCE_RE.search(segment)
    if fence:
        body = fence.group(1)
        return body if body.strip() else None
    if "```" in segment:  # "``` 1 2 ```" on one line
        inline = re.search(r"```(.*?)```", segment, re.DOTALL)
        return inline.group(1).strip() + "\n" if inline and inline.group(1).strip() else None
    text = segment.strip().split("\n\n")[0].strip().strip("`").strip()
    return text + "\n" if text else None


def parse_tests(text: str, limit: int = MAX_TESTS) -> list[tuple[str, str]]:
    """(input, output) pairs from `**Test Input:**` / `**Test Output:**` sections (the reference's
    format), in order; an input without an output is dropped. Text after </think> is preferred."""
    if "</think>" in text and _MARK_RE.search(text.rsplit("</think>", 1)[1]):
        text = text.rsplit("</think>", 1)[1]
    marks = list(_MARK_RE.finditer(text))
    tests: list[tuple[str, str]] = []
    for k, m in enumerate(marks):
        if (
            m.group(1).lower() != "input"
            or k + 1 >= len(marks)
            or marks[k + 1].group(1).lower() != "output"
        ):
            continue
        out_end = marks[k + 2].start() if k + 2 < len(marks) else len(text)
        inp = _segment_text(text[m.end() : marks[k + 1].start()])
        out = _segment_text(text[marks[k + 1].end() : out_end])
        if inp is not None and out is not None:
            tests.append(
                (
                    inp if inp.endswith("\n") else inp + "\n",
                    out if out.endswith("\n") else out + "\n",
                )
            )
        if len(tests) >= limit:
            break
    return tests


def _literal(text: str) -> Any:
    """One JSON value, or a Python literal (True, None, single quotes): never evaluated code, and
    bounded (a 10,000-deep `[[[...]]]` is refused, not a RecursionError)."""
    return literal(text, "a test's value")


def function_case(inp: str, out: str) -> tuple[str, str]:
    """A tester's function-call test in run form: arguments as JSON lines, canonical output."""
    args = [_literal(line) for line in inp.splitlines() if line.strip()]
    expected = _literal(out.strip())
    return code_formats.args_stdin(args), code_formats.canonical_json(expected) + "\n"

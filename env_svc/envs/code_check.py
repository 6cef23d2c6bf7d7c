"""Judging HumanEval-style problems: the answer completes a given prompt (signature + docstring),
and the problem's own test code (`def check(candidate): assert ...`) decides, run verbatim in the
sandbox. Nothing here runs model code; it only builds the program text that the sandbox runs.

HumanEval's executor runs `prompt + completion + test + check(entry_point)` in one namespace and
passes on no exception; `check_program` does the same (with stdout kept apart, see below), so a
solution passes here iff it passes HumanEval's test.
"""

from __future__ import annotations

import ast
import textwrap

# What the check program prints, on the real stdout, only after check() returned (the problem's
# expected stdout): the sandbox's RunTests compares stdout, and a candidate that exits early
# (sys.exit(0), os._exit(0)) or prints freely does not print this line.
from env_svc.code_formats import CHECK_PASSED

_CHECK = '''\
import io
import sys
import traceback

SOURCE = {source!r}
TEST = {test!r}
NAME = {name!r}


def main():
    real_stdout = sys.stdout
    sys.stdout = sys.stderr            # the solution's prints must not look like the verdict
    sys.stdin = io.StringIO("")
    ns = {{"__name__": "solution"}}    # not __main__: an answer's demo block does not run
    # Compiled apart, run in one namespace (as HumanEval's concatenation): an unterminated string in
    # the answer cannot swallow the test code.
    exec(compile(SOURCE, "solution.py", "exec"), ns)
    exec(compile(TEST, "test.py", "exec"), ns)
    if NAME not in ns:
        print(f"the program defines no function {{NAME}}", file=sys.stderr)
        sys.exit(3)
    ns["check"](ns[NAME])
    sys.stdout = real_stdout
    print({passed!r})


try:
    main()
except SystemExit:
    raise
except BaseException:
    traceback.print_exc()
    sys.exit(1)
'''


def check_program(source: str, test: str, entry_point: str) -> str:
    """A program that runs `source`, then `test`, then check(entry_point), and prints
    CHECK_PASSED when no assert failed (its expected stdout; stdin is empty)."""
    return _CHECK.format(source=source, test=test, name=entry_point, passed=CHECK_PASSED)


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
    bodies = [head + textwrap.indent(textwrap.dedent(text), "    ") + "\n", head + "    " + text + "\n"]
    return next((b for b in bodies if _parses(b)), bodies[0])


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):       # ValueError: a NUL byte
        return False
    return True


def _defines(source: str, name: str) -> bool:
    """`source` (which parses) defines `name` at top level."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
               for n in ast.parse(source).body)

"""Which of a code problem's tests its statement shows as examples.

Every test decides `success` and `done`; the examples are only left out of the paid fraction
(`paid_fraction`), so a program that prints the statement's answers earns nothing for them. A test
is an example when the statement shows its input and, right after it, its output, as one pair:

- in the example part of the statement (from the first `Example`, `Sample`, `for instance`,
  `e.g.`, `Input:`, `>>>` or fenced block to the end: Codeforces' `Examples` / `Input` / `Output`,
  AtCoder's `Sample Input 1` / `Sample Output 1`, LeetCode's `Input: nums = ...` / `Output:`,
  doctests), the output within GAP tokens after the input;
- anywhere, the input followed by a connector (`prints`, `returns`, `==`, `->`, ...) and then the
  output (`0 prints 0` in a sentence).

Text is compared as tokens, so the statement's formatting does not hide a pair: numbers, words
and single symbols, case-folded; backticks, quotes, commas, semicolons, colons, slashes and full
stops dropped (an output followed by a full stop or a comma, `3` / `1 9 4` for two input lines,
`two_sum([2, 7], 9)` for the JSON lines `[2,7]` and `9`); `name =` dropped (LeetCode names its
arguments); Python's True / False / None are JSON's true / false / null; decimals lose trailing
zeros. A number, value or word that merely occurs somewhere (`divisible by 4`, `0! = 1`,
`F(1) = 1`) is not a pair, so the edge cases a definition mentions stay paid tests.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Sequence

GAP = 4  # tokens allowed between an example's input and its output (`Sample Output 1`)
_TOKEN_RE = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|[^\W\d]\w*|==|->|=>|\S")
_DROPPED = frozenset("`\"',;:/.")
_LITERALS = {"none": "null"}  # True and False are JSON's once case-folded
_CONNECTORS = frozenset(
    {"==", "->", "=>", "→", "➞", "prints", "outputs", "returns", "gives", "yields"}
)
_EXAMPLE_MARK_RE = re.compile(
    r"\bexamples?\b|\bsamples?\b|\bfor instance\b|\be\.g\.|\binput\s*:|>>>|```", re.IGNORECASE
)


def _tokens(text: str) -> list[tuple[str, int]]:
    """(token, offset) in `text`, normalised as the module docstring says."""
    out: list[tuple[str, int]] = []
    for m in _TOKEN_RE.finditer(text):
        tok = m.group().lower()
        if tok in _DROPPED:
            continue
        if tok == "=" and out and out[-1][0][0].isalpha():  # `nums = [1, 2]`: an argument's name
            out.pop()
            continue
        if "." in tok and tok.lstrip("-")[:1].isdigit() and "e" not in tok:
            tok = tok.rstrip("0").rstrip(".")
        out.append((_LITERALS.get(tok, tok), m.start()))
    return out


class _Statement:
    def __init__(self, statement: str):
        toks = _tokens(statement)
        self.words = [t for t, _ in toks]
        mark = _EXAMPLE_MARK_RE.search(statement)
        start = mark.start() if mark else len(statement)
        self.in_examples = [at >= start for _, at in toks]
        self.where: dict[str, list[int]] = defaultdict(list)
        for i, w in enumerate(self.words):
            self.where[w].append(i)

    def at(self, toks: list[str], i: int) -> bool:
        return self.words[i : i + len(toks)] == toks

    def shows(self, inp: list[str], out: list[str]) -> bool:
        """The input occurs, and its output right after it as one pair."""
        if not inp or not out or len(inp) + len(out) > len(self.words):
            return False
        for i in self.where.get(inp[0], ()):
            if not self.at(inp, i):
                continue
            end = i + len(inp)
            for k in range(end, min(end + GAP, len(self.words)) + 1):
                if self.at(out, k) and (
                    self.in_examples[i] or not _CONNECTORS.isdisjoint(self.words[end:k])
                ):
                    return True
        return False


@functools.lru_cache(maxsize=4096)
def shown_examples(statement: str, tests: tuple[tuple[str, str], ...]) -> tuple[bool, ...]:
    """Per test (stdin, expected stdout; function problems: JSON argument lines and canonical
    JSON): whether the statement shows it as an example."""
    s = _Statement(statement)
    return tuple(_shown(s, statement, inp, out) for inp, out in tests)


def _shown(s: _Statement, statement: str, inp: str, out: str) -> bool:
    if len(inp) + len(out) > 4 * len(statement) + 64:  # cannot be in it (and not worth tokenising)
        return False
    return s.shows(_words(inp), _words(out))


def _words(text: str) -> list[str]:
    return [t for t, _ in _tokens(text)]


def paid_fraction(passed: Sequence[bool], examples: Sequence[bool]) -> float:
    """What a program's run on the hidden tests is paid: its pass fraction over the tests that are
    not examples and the examples it fails. A passed example counts nowhere, so printing the
    examples' answers earns 0; a failed one counts as a failed test, so a program wrong on an
    example is not paid in full. When every test is an example, every test is paid (there is
    nothing else to pay for)."""
    if all(examples):
        return sum(passed) / len(passed)
    counted = [ok for ok, shown in zip(passed, examples, strict=True) if not (ok and shown)]
    return sum(counted) / len(counted)

"""Answers to math problems, read from model text and compared as mathematics.

Model text never reaches eval, sympify or parse_expr: a LaTeX scanner, a whitelist tokenizer and
a recursive-descent parser build the sympy expression node by node, within bounds (answer length,
tokens, nesting, digits, the bits of exact numbers, roots, magnitudes, factorials, binomials; see
answer_expr.py). Equality is numeric, by answer_expr's bounded evaluator (256 bits; 128 at secret
points when variables occur), never sympy's evalf or simplify; intervals, sets, tuples and
equations compare by structure. Used by the `math` environment
(env_svc/envs/math.py).

What the judge guarantees (`judge_answer`; tests/env/test_integrity_math*.py try to break it):
- An answer it cannot judge raises JudgeError with a reason (too_large, too_deep, undefined,
  judge_failed), in bounded time and memory, never another exception: the env makes it a format
  failure. Every step is linear in the answer or bounded by a constant (MAX_RAW_CHARS, then
  MAX_ANSWER_CHARS; each expression is evaluated once however many set items it is paired with).
- No value stands for another: NaN, complex infinity, `0/0` and infinity inside arithmetic
  (`1/oo`) are refused; `oo` equals only `oo`; two integers are equal only exactly; a number is
  within rel_tol of the reference relative to the reference (never to the answer: 0 is not
  2^-20), absolutely next to an integer reference (a relative tolerance would make 1000000006.6
  equal to 1000000007), and within abs_tol of a reference of 0.
- More values never earn more: a list, set or union matches only one with as many items, matched
  one to one; `5 or 6`, `5, 6` and `\\pm 5` are not 5; `x = 5 = 1` needs every side to match.
  Words beside a number are not dropped unless they are units: `5\\text{ is not the answer}` is
  text, not 5.
- Variables are compared at generic points drawn per reference from a key of this process (the
  same points for one task every time, the same value per letter in both answers, none an answer
  can know), and an answer undefined at a point where the reference is defined (or the other
  way) is unequal; floor, ceiling and abs of a variable only match a reference that uses them.

This module reads an answer's structure and compares answers; the pieces it builds on are
siblings: answer_extract.py (the answer or program in model text), answer_latex.py (LaTeX to
plain syntax) and answer_expr.py (plain syntax to sympy, the numeric evaluator, the bounds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from atgrpo.sdk.judge import JudgeError
from env_svc.envs.answer_eval import (
    POINTS,
    Evaluator,
    Unbounded,
    sample_point,
    sample_values,
    variables,
)
from env_svc.envs.answer_expr import parse_expression
from env_svc.envs.answer_extract import _braced, extract_boxed
from env_svc.envs.answer_latex import latex_to_plain
from env_svc.envs.answer_limits import MAX_ANSWER_CHARS, MAX_ITEMS, AnswerError, too_deep, too_large

MAX_RAW_CHARS = 4 * MAX_ANSWER_CHARS  # before normalising (which drops $, \boxed{}, ^\circ ...)
MAX_STRUCTURE_DEPTH = 6  # sets of tuples of intervals ...
MAX_SYMBOLS = 8

# ---- structure: sets, intervals, tuples, equations --------------------------------------------


@dataclass(frozen=True, eq=False)
class _Expr:
    value: Any


@dataclass(frozen=True, eq=False)
class _Seq:  # tuples and intervals: ordered, brackets matter
    open: str
    close: str
    items: tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class _Set:  # sets, comma lists, unions of intervals: unordered
    items: tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class _Chain:  # x = 2 + 1 = 3: every side must match
    items: tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class _Text:
    text: str


_OPEN, _CLOSE = "([⦃", ")]⦄"


def _split_top(s: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _wraps(s: str) -> bool:
    """Whether s[0] opens a bracket that closes exactly at s[-1]."""
    depth = 0
    for i, ch in enumerate(s):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0 and i != len(s) - 1:
                return False
    return depth == 0


# `(?<!\s)\s++`: a run of spaces is tried once, from its start (`\s+` alone retries from every
# space in the run: quadratic on a long one)
_AND_OR_RE = re.compile(r"(?<!\s)\s++(?:and|or)\s+")
# \emptyset = \varnothing = \{\}
_EMPTY_RE = re.compile(r"\\(?:varnothing|emptyset)(?![A-Za-z])|\\\{\s*+\\\}")
_TEXT_AND_OR_RE = re.compile(r"\\(?:text|mbox)\{\s*+(?:and|or)\s*+\}")


def _normalize(s: str) -> str:
    s = s.strip()
    boxed = extract_boxed(s)
    if boxed is not None:
        s = boxed
    s = re.sub(r"(?<!\\)\$", "", s).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = s.replace("−", "-").replace("×", "*").replace("·", "*").replace("÷", "/").replace("π", "pi")
    s = (
        s.replace("∞", "oo")
        .replace("√", "sqrt")
        .replace("°", "")
        .replace("^\\circ", "")
        .replace("^{\\circ}", "")
    )
    s = _EMPTY_RE.sub("∅", s)
    s = _TEXT_AND_OR_RE.sub(",", s)
    s = _AND_OR_RE.sub(",", s)
    s = s.rstrip(".").strip()
    return s


def parse_answer(raw: str) -> Any:
    """The structure of an answer string; text when it does not read as mathematics. JudgeError
    when it is past a bound (too long, too deep, too large) or undefined."""
    s = _normalize(raw)
    if len(s) > MAX_ANSWER_CHARS:
        raise too_large(f"text ({len(s)} characters, over {MAX_ANSWER_CHARS})")
    try:
        if (
            s.startswith("{")
            and s.endswith("}")
            and _braced(s, 0) == (s[1:-1], len(s))
            and "," in s
        ):
            s = "\\{" + s[1:-1] + "\\}"  # a bare {1, 2} is a set, not a LaTeX group
        plain = latex_to_plain(s)
        words = re.findall(r"⟦([^⟧]*)⟧", plain)
        rest = re.sub(r"⟦[^⟧]*⟧", " ", plain).strip()
        if words and not rest:
            return _Text(" ".join(words).lower())
        if any(w.lower() not in _UNITS for group in words for w in group.split()):
            # `5\text{ is not the answer}`: words beside a number are not a unit to drop
            raise AnswerError("words beside mathematics are compared as text")
        return _structure(rest, 0)
    except AnswerError:
        return _Text(re.sub(r"\s+", "", s).lower())


_UNITS = {
    "cm",
    "mm",
    "km",
    "m",
    "kg",
    "g",
    "s",
    "sec",
    "seconds",
    "minutes",
    "min",
    "hours",
    "hr",
    "h",
    "days",
    "degrees",
    "degree",
    "deg",
    "units",
    "unit",
    "inches",
    "inch",
    "in",
    "feet",
    "ft",
    "meters",
    "metres",
    "dollars",
    "cents",
    "percent",
    "sq",
    "square",
    "cubic",
    "mph",
    "liters",
    "ml",
    "l",
    "radians",
    "rad",
}


def _strip_units(s: str) -> str:
    m = re.fullmatch(r"(.*?[\d)])\s*([A-Za-z]+(?:\s+[A-Za-z]+)?)\s*", s)
    if m and all(w.lower() in _UNITS for w in m.group(2).split()):
        return m.group(1)
    return s


def _structure(s: str, depth: int) -> Any:
    if depth > MAX_STRUCTURE_DEPTH:
        raise too_deep("structure (sets, tuples, intervals inside each other)")
    s = s.strip()
    if not s:
        raise AnswerError("empty")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")  # 1,000,000
    if any(ch in s for ch in "<>≤≥≠±…|'∅"):
        raise AnswerError("inequalities and other relations are compared as text")
    union = _split_top(s, "∪")
    if len(union) > 1:
        return _Set(tuple(_structure(p, depth + 1) for p in _limit(union)))
    if s[0] == "⦃" and s[-1] == "⦄" and _wraps(s):
        inner = s[1:-1].strip()
        items = _split_top(inner, ",") if inner else []
        return _Set(tuple(_structure(p, depth + 1) for p in _limit(items)))
    if s[0] in "([" and s[-1] in ")]" and _wraps(s):
        items = _split_top(s[1:-1], ",")
        if len(items) > 1:
            return _Seq(s[0], s[-1], tuple(_structure(p, depth + 1) for p in _limit(items)))
    items = _split_top(s, ",")
    if len(items) > 1:
        return _Set(tuple(_structure(p, depth + 1) for p in _limit(items)))
    sides = _split_top(s, "=")
    if len(sides) > 1:
        return _equation(sides, depth)
    return _Expr(parse_expression(_strip_units(s)))


def _equation(sides: list[str], depth: int) -> Any:
    """`x = 3` is 3 and `x = 2 + 1 = 3` is 3 if every side is; `x^2 + y^2 = 1` is an equation
    (lhs - rhs, up to sign). A chain without a variable on the left is text: which sides would be
    the equation?"""
    lhs = sides[0].strip()
    if re.fullmatch(r"[A-Za-z](_?\w)?(\([A-Za-z]\))?", lhs):
        rhs = [_structure(p, depth + 1) for p in _limit(sides[1:])]
        return rhs[0] if len(rhs) == 1 else _Chain(tuple(rhs))
    if len(sides) > 2:
        raise AnswerError("a chain of equations")
    diff = parse_expression(_strip_units(lhs)) - parse_expression(_strip_units(sides[1]))
    return _Seq("=", "=", (_Expr(diff),))


def _limit(items: list[str]) -> list[str]:
    if len(items) > MAX_ITEMS:
        raise too_large(f"list ({len(items)} items, over {MAX_ITEMS})")
    return items


# ---- comparison -------------------------------------------------------------------------------


def _piecewise(x: Any) -> set[str]:
    """The floor, ceiling and abs applied to a variable in x: piecewise functions, which sampled
    points cannot tell from others (floor(x/4) and abs(x) - x vanish at every point)."""
    import sympy as sp

    return {type(f).__name__ for f in x.atoms(sp.floor, sp.ceiling, sp.Abs) if variables(f)}


class _Judge:
    """One comparison: its tolerances, and caches so that each expression is evaluated once (at
    each point), and each pair of items matched once, however often a set matching asks."""

    def __init__(self, rel_tol: float, abs_tol: float, reference: str):
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.reference = reference  # the seed of the sample points, drawn when variables occur
        self.points: list[float] | None = None
        self.pairs: dict[tuple[int, int], bool] = {}
        self.evaluators: dict[tuple[int, frozenset[str]] | None, Evaluator] = {}

    def match(self, a: Any, b: Any) -> bool:
        key = (id(a), id(b))
        got = self.pairs.get(key)
        if got is None:
            got = self.pairs[key] = self._match(a, b)
        return got

    def _match(self, a: Any, b: Any) -> bool:
        if isinstance(a, _Chain):
            return all(self.match(x, b) for x in a.items)
        if isinstance(b, _Chain):
            return all(self.match(a, y) for y in b.items)
        if isinstance(a, _Set) and len(a.items) == 1 and not isinstance(b, _Set):
            return self.match(a.items[0], b)
        if isinstance(b, _Set) and len(b.items) == 1 and not isinstance(a, _Set):
            return self.match(a, b.items[0])
        if type(a) is not type(b):
            return False
        if isinstance(a, _Text):
            return a.text == b.text
        if isinstance(a, _Expr):
            return self.equal(a.value, b.value)
        if isinstance(a, _Seq):
            if (a.open, a.close) != (b.open, b.close) or len(a.items) != len(b.items):
                return False
            if a.open == "=":  # equations: lhs - rhs equal up to sign
                d1, d2 = a.items[0].value, b.items[0].value
                return self.equal(d1, d2) or self.equal(d1, -d2)
            return all(self.match(x, y) for x, y in zip(a.items, b.items, strict=True))
        return self._same_set(a.items, b.items)

    def _same_set(self, xs: tuple[Any, ...], ys: tuple[Any, ...]) -> bool:
        """A one-to-one matching of xs onto ys (Kuhn's algorithm on the n x n table of matches,
        n <= MAX_ITEMS): as many items, each matched once, so a list of candidates never matches
        a shorter answer."""
        if len(xs) != len(ys):
            return False
        table = [[self.match(x, y) for y in ys] for x in xs]
        owner: dict[int, int] = {}

        def assign(i: int, seen: set[int]) -> bool:
            for j, ok in enumerate(table[i]):
                if ok and j not in seen:
                    seen.add(j)
                    if j not in owner or assign(owner[j], seen):
                        owner[j] = i
                        return True
            return False

        return all(assign(i, set()) for i in range(len(xs)))

    # ---- expressions --------------------------------------------------------------------------

    def equal(self, a: Any, b: Any) -> bool:
        """Answer `a` and reference `b`, two sympy expressions: equal as built, else numerically
        (the bounded evaluator, never sympy's evalf, which re-evaluates nested logs at rising
        precision: exponential in their depth), at the reference's secret points when variables
        occur. Two integers are equal only exactly; floor, ceiling and abs of a variable only
        where both use them (sampled points cannot tell abs(x) - x from 0)."""
        if a == b:
            return True
        if a.is_Integer and b.is_Integer:
            return False
        symbols = variables(a) | variables(b)
        if len(symbols) > MAX_SYMBOLS:
            return False
        if symbols and _piecewise(a) != _piecewise(b):
            return False
        letters = frozenset(v.name for v in symbols)
        points = [(k, letters) for k in range(POINTS)] if symbols else [None]
        integer = not symbols and bool(b.is_Integer)
        agreed = 0
        for at in points:
            va, vb = self._value(a, at), self._value(b, at)
            if va is None and vb is None:
                continue  # both undefined (or past the bounds) here: no evidence
            if (
                va is None
                or vb is None
                or not self._close(self._evaluator(at).ctx, va, vb, integer)
            ):
                return False
            agreed += 1
        return agreed > 0

    def _evaluator(self, at: tuple[int, frozenset[str]] | None) -> Evaluator:
        """The evaluator of sample point `at` (point k for these letters; None: no variables, 256
        bits, so that 30 digits survive cancellation in honest answers like sqrt(10^20 + 1) -
        10^10); made once per comparison."""
        ev = self.evaluators.get(at)
        if ev is None and at is None:
            ev = self.evaluators[at] = Evaluator(256)
        elif ev is None:
            if self.points is None:
                self.points = sample_values(self.reference)
            ev = self.evaluators[at] = Evaluator(128, sample_point(self.points, *at))
        return ev

    def _value(self, x: Any, at: tuple[int, frozenset[str]] | None) -> Any:
        try:
            return self._evaluator(at).value(x)
        except (Unbounded, RecursionError):
            return None

    def _close(self, ctx: Any, u: Any, v: Any, integer: bool) -> bool:
        """The answer's value u within tolerance of the reference's v; infinities equal only
        themselves. The tolerance is rel_tol relative to the reference, never to the answer (an
        answer of 0 would bring its own tolerance down to nothing; one of 1e9 up to 1000). Next to
        an integer reference it is absolute, as if the integer were 1 (a relative one makes
        1000000006.6 equal to 1000000007), and a reference of 0 takes abs_tol (1e-9: a program's
        float noise), so that 0 and 2^-20 are different answers both ways."""
        if ctx.isinf(u) or ctx.isinf(v):
            return bool(u == v)
        if v == 0:
            return bool(abs(u) <= self.abs_tol)
        return bool(abs(u - v) <= self.rel_tol * (1 if integer else abs(v)))


def _words(s: str) -> str:
    """A text answer reduced to its lowercase letters, digits and signs (\\text{No} -> no)."""
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*", "", s)
    return re.sub(r"[\s{}$\\]", "", s).lower()


_UNEXPECTED = (
    ArithmeticError,
    ValueError,
    TypeError,
    AttributeError,
    RecursionError,
    MemoryError,
    KeyError,
    IndexError,
)


def judge_answer(pred: str, gold: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether answer `pred` is mathematically the same as `gold` (see the module docstring).
    Raises JudgeError when `pred` cannot be judged (too long, too large, too deep, undefined); a
    reference past the bounds is compared as text."""
    if pred is None or gold is None:
        return False
    pred, gold = str(pred), str(gold)
    if len(pred) > MAX_RAW_CHARS:
        raise too_large(f"text ({len(pred)} characters, over {MAX_RAW_CHARS})")
    if len(gold) > MAX_RAW_CHARS:  # a reference past the bounds: as text
        return re.sub(r"\s+", "", pred) == re.sub(r"\s+", "", gold)
    p, g = _normalize(pred), _normalize(gold)
    if not p:
        return False
    if re.sub(r"\s+", "", p).lower() == re.sub(r"\s+", "", g).lower():
        return True
    pa = _guarded(parse_answer, p)
    try:
        ga = parse_answer(g)
    except (JudgeError, *_UNEXPECTED):
        ga = _Text(g)
    if isinstance(pa, _Text) or isinstance(ga, _Text):
        return _words(p) == _words(g)
    return _guarded(_Judge(rel_tol, abs_tol, g).match, pa, ga)


def _guarded(fn: Any, *args: Any) -> Any:
    """fn(*args), with anything but a JudgeError (a sympy or mpmath failure on a shape the
    bounds let through) turned into JudgeError("judge_failed"): never an exception out of step."""
    try:
        return fn(*args)
    except JudgeError:
        raise
    except _UNEXPECTED as e:
        raise JudgeError(
            "judge_failed", f"the judge could not compare this answer ({type(e).__name__})"
        ) from None


def answers_match(pred: str, gold: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """judge_answer, with an answer it cannot judge simply unequal."""
    try:
        return judge_answer(pred, gold, rel_tol, abs_tol)
    except JudgeError:
        return False

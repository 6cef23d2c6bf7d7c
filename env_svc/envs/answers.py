"""Answers to math problems, read from model text and compared as mathematics.

Model text never reaches eval, sympify or parse_expr: a LaTeX scanner, a whitelist tokenizer and
a recursive-descent parser build the sympy expression node by node, within size bounds (answer
length, tokens, nesting, digits, power bits, factorials, binomials). Equality is numeric at 30
digits (at fixed points when variables occur); intervals, sets, tuples and equations compare by
structure. Used by the `math` environment (env_svc/envs/math.py).

This module reads an answer's structure and compares answers (`answers_match`); the pieces it
builds on are siblings: answer_extract.py (the answer or program in model text), answer_latex.py
(LaTeX to plain syntax) and answer_expr.py (plain syntax to sympy, and the size bounds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from env_svc.envs.answer_expr import MAX_ANSWER_CHARS, MAX_ITEMS, AnswerError, parse_expression
from env_svc.envs.answer_extract import _braced, extract_boxed
from env_svc.envs.answer_latex import latex_to_plain

# ---- structure: sets, intervals, tuples, equations --------------------------------------------

@dataclass(frozen=True)
class _Expr:
    value: Any


@dataclass(frozen=True)
class _Seq:                 # tuples and intervals: ordered, brackets matter
    open: str
    close: str
    items: tuple[Any, ...]


@dataclass(frozen=True)
class _Set:                 # sets, comma lists, unions of intervals: unordered
    items: tuple[Any, ...]


@dataclass(frozen=True)
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


def _normalize(s: str) -> str:
    s = s.strip()
    boxed = extract_boxed(s)
    if boxed is not None:
        s = boxed
    s = re.sub(r"(?<!\\)\$", "", s).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = s.replace("−", "-").replace("×", "*").replace("·", "*").replace("÷", "/").replace("π", "pi")
    s = s.replace("∞", "oo").replace("√", "sqrt").replace("°", "").replace("^\\circ", "").replace("^{\\circ}", "")
    s = re.sub(r"\\(?:text|mbox)\{\s*(?:and|or)\s*\}", ",", s)
    s = re.sub(r"\s+(?:and|or)\s+", ",", s)
    s = s.rstrip(".").strip()
    return s


def parse_answer(raw: str) -> Any:
    """The structure of an answer string; text when it does not read as mathematics."""
    s = _normalize(raw)
    if len(s) > MAX_ANSWER_CHARS:
        raise AnswerError(f"longer than {MAX_ANSWER_CHARS} characters")
    try:
        if s.startswith("{") and s.endswith("}") and _braced(s, 0) == (s[1:-1], len(s)) and "," in s:
            s = "\\{" + s[1:-1] + "\\}"        # a bare {1, 2} is a set, not a LaTeX group
        plain = latex_to_plain(s)
        words = re.findall(r"⟦([^⟧]*)⟧", plain)
        rest = re.sub(r"⟦[^⟧]*⟧", " ", plain).strip()
        if words and not rest:
            return _Text(" ".join(words).lower())
        return _structure(rest, 0)
    except AnswerError:
        return _Text(re.sub(r"\s+", "", s).lower())


_UNITS = {"cm", "mm", "km", "m", "kg", "g", "s", "sec", "seconds", "minutes", "min", "hours", "hr", "h", "days",
          "degrees", "degree", "deg", "units", "unit", "inches", "inch", "in", "feet", "ft", "meters", "metres",
          "dollars", "cents", "percent", "sq", "square", "cubic", "mph", "liters", "ml", "l", "radians", "rad"}


def _strip_units(s: str) -> str:
    m = re.fullmatch(r"(.*?[\d)])\s*([A-Za-z]+(?:\s+[A-Za-z]+)?)\s*", s)
    if m and all(w.lower() in _UNITS for w in m.group(2).split()):
        return m.group(1)
    return s


def _structure(s: str, depth: int) -> Any:
    if depth > 6:
        raise AnswerError("nested too deeply")
    s = s.strip()
    if not s:
        raise AnswerError("empty")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")                      # 1,000,000
    if any(ch in s for ch in "<>≤≥≠±…|'∅"):
        raise AnswerError("inequalities and other relations are compared as text")
    union = _split_top(s, "∪")
    if len(union) > 1:
        return _Set(tuple(_structure(p, depth + 1) for p in union))
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
        lhs = sides[0].strip()
        if re.fullmatch(r"[A-Za-z](_?\w)?(\([A-Za-z]\))?", lhs):
            return _structure(sides[-1], depth + 1)       # x = 3, f(x) = 2x
        return _Seq("=", "=", (_Expr(parse_expression(_strip_units(lhs)) - parse_expression(_strip_units(sides[-1]))),))
    return _Expr(parse_expression(_strip_units(s)))


def _limit(items: list[str]) -> list[str]:
    if len(items) > MAX_ITEMS:
        raise AnswerError(f"more than {MAX_ITEMS} items")
    return items


# ---- comparison -------------------------------------------------------------------------------

_POINTS = [(1.37, 0.61, 2.23, 1.09), (0.73, 1.91, 0.57, 2.71), (2.39, 1.13, 1.79, 0.83), (1.61, 2.57, 0.97, 1.41)]


def _close(va: Any, vb: Any, rel_tol: float, abs_tol: float) -> bool:
    """Two numeric values (sympy numbers, evaluated) within tolerance; infinities equal only
    themselves; nan and complex infinity equal nothing."""
    import sympy as sp
    bad = (sp.nan, sp.zoo)
    if va in bad or vb in bad or not (va.is_number and vb.is_number):
        return False
    if va.has(sp.oo, -sp.oo) or vb.has(sp.oo, -sp.oo):
        return bool(va == vb)
    diff, size = abs(va - vb), max(abs(va), abs(vb))
    return bool(diff <= max(abs_tol, rel_tol * size))


def _expr_equal(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    """Numeric equality at 30 digits; with variables, at up to 8 fixed points (floats, so that a
    huge symbolic power is evaluated in floating point, never exactly)."""
    import sympy as sp
    if a == b:
        return True
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    if not symbols:
        return _close(sp.N(a, 30), sp.N(b, 30), rel_tol, abs_tol)
    if len(symbols) > 8:
        return False
    agreed = 0
    for k, point in enumerate(_POINTS * 2):
        subs = {s: sp.Float(point[(j + k) % 4] + j, 30) for j, s in enumerate(symbols)}
        try:
            va, vb = a.evalf(30, subs=subs), b.evalf(30, subs=subs)
            if va.free_symbols or vb.free_symbols or va in (sp.nan, sp.zoo) or vb in (sp.nan, sp.zoo):
                continue
            if not _close(va, vb, rel_tol, abs_tol):
                return False
        except (TypeError, ValueError, ArithmeticError):
            continue
        agreed += 1
        if agreed >= 3:
            return True
    return agreed > 0


def _match(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(a, _Set) and len(a.items) == 1 and not isinstance(b, _Set):
        return _match(a.items[0], b, rel_tol, abs_tol)
    if isinstance(b, _Set) and len(b.items) == 1 and not isinstance(a, _Set):
        return _match(a, b.items[0], rel_tol, abs_tol)
    if type(a) is not type(b):
        return False
    if isinstance(a, _Text):
        return a.text == b.text
    if isinstance(a, _Expr):
        return _expr_equal(a.value, b.value, rel_tol, abs_tol)
    if isinstance(a, _Seq):
        if (a.open, a.close) != (b.open, b.close) or len(a.items) != len(b.items):
            return False
        if a.open == "=":        # equations: lhs - rhs equal up to sign
            d1, d2 = a.items[0].value, b.items[0].value
            return _expr_equal(d1, d2, rel_tol, abs_tol) or _expr_equal(d1, -d2, rel_tol, abs_tol)
        return all(_match(x, y, rel_tol, abs_tol) for x, y in zip(a.items, b.items, strict=True))
    # sets: a perfect matching between the items (Kuhn's algorithm; at most MAX_ITEMS each)
    if len(a.items) != len(b.items):
        return False
    owner: dict[int, int] = {}

    def assign(i: int, seen: set[int]) -> bool:
        for j, y in enumerate(b.items):
            if j in seen or not _match(a.items[i], y, rel_tol, abs_tol):
                continue
            seen.add(j)
            if j not in owner or assign(owner[j], seen):
                owner[j] = i
                return True
        return False

    return all(assign(i, set()) for i in range(len(a.items)))


def _words(s: str) -> str:
    """A text answer reduced to its lowercase letters, digits and signs (\\text{No} -> no)."""
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*", "", s)
    return re.sub(r"[\s{}$\\]", "", s).lower()


def answers_match(pred: str, gold: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Whether answer `pred` is mathematically the same as `gold` (see the module docstring)."""
    if pred is None or gold is None:
        return False
    p, g = _normalize(str(pred)), _normalize(str(gold))
    if not p or len(p) > MAX_ANSWER_CHARS:
        return False
    if re.sub(r"\s+", "", p).lower() == re.sub(r"\s+", "", g).lower():
        return True
    try:
        pa, ga = parse_answer(p), parse_answer(g)
        if isinstance(pa, _Text) or isinstance(ga, _Text):
            return _words(p) == _words(g)
        return _match(pa, ga, rel_tol, abs_tol)
    except (AnswerError, TypeError, ValueError, ArithmeticError, RecursionError, AttributeError):
        return False

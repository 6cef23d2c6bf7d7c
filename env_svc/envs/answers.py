"""Answers to math problems, read from model text and compared as mathematics.

Model text never reaches eval, sympify or parse_expr: a LaTeX scanner, a whitelist tokenizer and
a recursive-descent parser build the sympy expression node by node, within size bounds (answer
length, tokens, nesting, digits, power bits, factorials, binomials). Equality is numeric at 30
digits (at fixed points when variables occur); intervals, sets, tuples and equations compare by
structure. Used by the `math` environment (env_svc/envs/math.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------------------------------------
# Extracting answers from model text

_CODE_RE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The program in `text`: the last ```python block, else the last unlabeled ``` block; an
    unterminated last block counts. Text after a closing </think> is preferred when it has one."""
    if "</think>" in text:
        after = text.rsplit("</think>", 1)[1]
        if "```" in after:
            text = after
    blocks = [(lang, body) for lang, body in _CODE_RE.findall(text) if body.strip()]
    labeled = [b for lang, b in blocks if lang]
    if labeled:
        return labeled[-1]
    return blocks[-1][1] if blocks else None


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The content of the {...} group opening at text[start], and the index after it."""
    depth = 0
    for i in range(start, min(len(text), start + 20_000)):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            continue
        if text[i] == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif text[i] == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) in `text`, or None."""
    for m in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))[-20:]):   # the last few only: bounded work
        got = _braced(text, m.end() - 1)
        if got is not None and got[0].strip():
            return got[0].strip()
    return None


_FINAL_RE = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:：]\s*(.+)", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The reasoner's final answer: the last \\boxed{...}, else the last "Final answer: X" line."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    for line in reversed(text.strip().splitlines()):
        m = _FINAL_RE.search(line)
        if m and m.group(1).strip():
            return m.group(1).strip().rstrip(".").strip().strip("$").strip()
    return None


def stdout_answer(stdout: str) -> str | None:
    """A tool program's answer: its last non-empty stdout line, unwrapped from \\boxed{} or
    `Answer:`."""
    lines = [ln.strip() for ln in stdout.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1]
    boxed = extract_boxed(last)
    if boxed is not None:
        return boxed
    m = _FINAL_RE.search(last)
    return (m.group(1).strip() if m else last)[:400]


# ---------------------------------------------------------------------------------------------
# Parsing answers without eval

MAX_ANSWER_CHARS = 400
MAX_TOKENS = 300
MAX_DEPTH = 50
MAX_DIGITS = 100
MAX_POW_BITS = 20_000
MAX_FACTORIAL = 300
MAX_BINOMIAL = 1_000
MAX_ITEMS = 32


class AnswerError(ValueError):
    """An answer that cannot be read as mathematics (it is then compared as text)."""


_DROP_CMDS = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
              "textstyle", ",", ";", ":", "!", " ", "quad", "qquad", "limits", "nolimits", "$", "%"}
_SYMBOL_CMDS = {"cdot": "*", "times": "*", "ast": "*", "div": "/", "pi": "pi", "infty": "oo", "infinity": "oo",
                "cup": "∪", "{": "⦃", "}": "⦄", "lbrace": "⦃", "rbrace": "⦄", "lvert": "|", "rvert": "|",
                "mid": "|", "vert": "|", "circ": "", "degree": "", "prime": "'", "e": "e", "i": "i",
                "lt": "<", "gt": ">", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠",
                "pm": "±", "emptyset": "∅", "varnothing": "∅", "langle": "(", "rangle": ")", "dots": "…",
                "ldots": "…", "cdots": "…"}
_TEXT_CMDS = {"text", "textbf", "textit", "textrm", "mathrm", "mathbf", "mathit", "operatorname", "mbox", "rm",
              "mathsf", "textsf", "boldsymbol", "bf", "it"}
_FRAC_CMDS = {"frac", "dfrac", "tfrac", "cfrac"}
_BINOM_CMDS = {"binom", "dbinom", "tbinom", "choose"}
_UNITS = {"cm", "mm", "km", "m", "kg", "g", "s", "sec", "seconds", "minutes", "min", "hours", "hr", "h", "days",
          "degrees", "degree", "deg", "units", "unit", "inches", "inch", "in", "feet", "ft", "meters", "metres",
          "dollars", "cents", "percent", "sq", "square", "cubic", "mph", "liters", "ml", "l", "radians", "rad"}


def _arg(s: str, i: int) -> tuple[str, int]:
    """One LaTeX macro argument at s[i:]: a {...} group or a single token."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise AnswerError("a LaTeX command is missing its argument")
    if s[i] == "{":
        got = _braced(s, i)
        if got is None:
            raise AnswerError("unbalanced braces")
        return got
    if s[i] == "\\":
        m = re.match(r"\\[A-Za-z]+", s[i:])
        if m:
            return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def _log_arg(s: str, i: int) -> tuple[str, int]:
    """The argument of \\log_b: a (...) or {...} group, or a run of letters, digits and dots."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] in "({":
        close = {"(": ")", "{": "}"}[s[i]]
        depth = 0
        for j in range(i, len(s)):
            depth += s[j] == s[i]
            depth -= s[j] == close
            if depth == 0:
                return s[i + 1:j], j + 1
        raise AnswerError("unbalanced brackets after \\log")
    m = re.match(r"[0-9A-Za-z.]+", s[i:])
    if m is None:
        raise AnswerError("\\log_b without an argument")
    return m.group(0), i + len(m.group(0))


def latex_to_plain(s: str, depth: int = 0) -> str:
    """LaTeX answer text -> the plain syntax the tokenizer reads (`\\frac{a}{b}` -> `((a)/(b))`).
    Set braces become ⦃ ⦄, unions ∪; unsupported commands raise AnswerError."""
    if depth > MAX_DEPTH:
        raise AnswerError("nested too deeply")
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c != "\\":
            out.append({"{": "(", "}": ")"}.get(c, c))
            i += 1
            continue
        m = re.match(r"\\([A-Za-z]+|.)", s[i:])
        if m is None:
            i += 1
            continue
        name = m.group(1)
        i += len(m.group(0))
        if name in _FRAC_CMDS:
            a, i = _arg(s, i)
            b, i = _arg(s, i)
            out.append(f"(({latex_to_plain(a, depth + 1)})/({latex_to_plain(b, depth + 1)}))")
        elif name in _BINOM_CMDS:
            a, i = _arg(s, i)
            b, i = _arg(s, i)
            out.append(f"binomial(({latex_to_plain(a, depth + 1)}),({latex_to_plain(b, depth + 1)}))")
        elif name == "sqrt":
            index = None
            j = i
            while j < len(s) and s[j] == " ":
                j += 1
            if j < len(s) and s[j] == "[":
                close = s.find("]", j)
                if close < 0:
                    raise AnswerError("\\sqrt[ without ]")
                index, i = s[j + 1:close], close + 1
            a, i = _arg(s, i)
            inner = latex_to_plain(a, depth + 1)
            out.append(f"(({inner})^(1/({latex_to_plain(index, depth + 1)})))" if index else f"sqrt({inner})")
        elif name in _TEXT_CMDS:
            a, i = _arg(s, i)
            words = a.strip()
            if re.fullmatch(r"[A-Za-z ]*", words) and len(words.replace(" ", "")) > 1:
                out.append(f" ⟦{words}⟧ ")     # words: units, or a text answer (decided later)
            else:
                out.append(latex_to_plain(a, depth + 1))
        elif name in ("left", "right") and i < len(s) and s[i] == ".":
            i += 1
        elif name in _DROP_CMDS:
            pass
        elif name in _SYMBOL_CMDS:
            out.append(_SYMBOL_CMDS[name])
        elif name == "log" and s[i:i + 1] == "_":
            base, i = _arg(s, i + 1)
            x, i = _log_arg(s, i)
            out.append(f"(log({latex_to_plain(x, depth + 1)})/log({latex_to_plain(base, depth + 1)}))")
        elif name in _FUNCS or name in ("ln", "log", "arcsin", "arccos", "arctan"):
            out.append(f" {name} ")
        else:
            raise AnswerError(f"unsupported LaTeX command \\{name}")
    return "".join(out)


def _funcs() -> dict[str, tuple[Any, tuple[int, ...]]]:
    import sympy as sp
    return {
        "sqrt": (sp.sqrt, (1,)), "cbrt": (sp.cbrt, (1,)), "exp": (sp.exp, (1,)), "ln": (sp.log, (1,)),
        "log": (sp.log, (1, 2)), "sin": (sp.sin, (1,)), "cos": (sp.cos, (1,)), "tan": (sp.tan, (1,)),
        "cot": (sp.cot, (1,)), "sec": (sp.sec, (1,)), "csc": (sp.csc, (1,)), "asin": (sp.asin, (1,)),
        "acos": (sp.acos, (1,)), "atan": (sp.atan, (1,)), "arcsin": (sp.asin, (1,)),
        "arccos": (sp.acos, (1,)), "arctan": (sp.atan, (1,)), "sinh": (sp.sinh, (1,)),
        "cosh": (sp.cosh, (1,)), "tanh": (sp.tanh, (1,)), "abs": (sp.Abs, (1,)),
        "floor": (sp.floor, (1,)), "ceil": (sp.ceiling, (1,)), "binomial": (None, (2,)),
    }


_FUNCS = {"sqrt", "cbrt", "exp", "ln", "log", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan",
          "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "abs", "floor", "ceil", "binomial"}
_CONSTS = {"pi", "e", "i", "oo", "inf", "infty", "infinity"}
_NAMES = sorted((n for n in _FUNCS | _CONSTS if len(n) > 1), key=len, reverse=True)
_TOKEN_RE = re.compile(r"\s*(?:(\d+(?:\.\d*)?(?:[eE][+-]?\d{1,3}(?![A-Za-z]))?|\.\d+)|([A-Za-z]+)|(\*\*|[-+*/^(),!]))")


def tokenize(text: str) -> list[tuple[str, str]]:
    """Whitelisted tokens: ("num", "12.5"), ("id", name), ("op", "+"). Anything else raises."""
    tokens: list[tuple[str, str]] = []
    i = 0
    text = text.rstrip()
    while i < len(text):
        m = _TOKEN_RE.match(text, i)
        if m is None or m.end() == i:
            raise AnswerError(f"unexpected character {text[i]!r}")
        i = m.end()
        num, word, op = m.groups()
        if num is not None:
            if len(num) > MAX_DIGITS:
                raise AnswerError("a number with too many digits")
            tokens.append(("num", num))
        elif op is not None:
            tokens.append(("op", "^" if op == "**" else op))
        else:
            tokens += _split_word(word)
        if len(tokens) > MAX_TOKENS:
            raise AnswerError("too many tokens")
    return tokens


def _split_word(word: str) -> list[tuple[str, str]]:
    """A run of letters: known names (longest first) and single-letter variables; a word of 4+
    letters with no known name in it is text, not algebra."""
    if word in _FUNCS or word in _CONSTS:
        return [("id", word)]
    out: list[tuple[str, str]] = []
    j = 0
    while j < len(word):
        name = next((n for n in _NAMES if word.startswith(n, j)), None)
        if name:
            out.append(("id", name))
            j += len(name)
        else:
            out.append(("id", word[j]))
            j += 1
    if len(word) >= 4 and all(len(v) == 1 for _, v in out):
        raise AnswerError(f"{word!r} is a word, not algebra")
    return out


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary | implicit power)* ;
    unary := ('-'|'+') unary | power ; power := postfix ('^' unary)? ; postfix := atom '!'* ;
    atom := number | name | name '(' args ')' | func power | '(' expr ')'."""

    def __init__(self, tokens: list[tuple[str, str]]):
        import sympy as sp
        self.sp, self.t, self.i, self.depth = sp, tokens, 0, 0
        self.funcs = _funcs()

    def peek(self) -> tuple[str | None, str | None]:
        return self.t[self.i] if self.i < len(self.t) else (None, None)

    def take(self) -> tuple[str | None, str | None]:
        tok = self.peek()
        self.i += 1
        return tok

    def parse(self) -> Any:
        if not self.t:
            raise AnswerError("empty")
        node = self.expr()
        if self.i != len(self.t):
            raise AnswerError(f"unexpected {self.peek()[1]!r}")
        return node

    def expr(self) -> Any:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise AnswerError("nested too deeply")
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            rhs = self.term()
            node = node + rhs if op == "+" else node - rhs
        self.depth -= 1
        return node

    def term(self) -> Any:
        node = self.unary()
        while True:
            kind, val = self.peek()
            if (kind, val) == ("op", "*"):
                self.take()
                node = node * self.unary()
            elif (kind, val) == ("op", "/"):
                self.take()
                d = self.unary()
                if d == 0:
                    raise AnswerError("division by zero")
                node = node / d
            elif kind in ("num", "id") or (kind, val) == ("op", "("):
                node = node * self.power()           # implicit multiplication: 2x, (x-1)(x+1)
            else:
                return node

    def unary(self) -> Any:
        if self.peek() == ("op", "-"):
            self.take()
            return -self.unary()
        if self.peek() == ("op", "+"):
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> Any:
        base = self.postfix()
        if self.peek() == ("op", "^"):
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise AnswerError("nested too deeply")
            exp = self.unary()
            self.depth -= 1
            return self._pow(base, exp)
        return base

    def postfix(self) -> Any:
        node = self.atom()
        while self.peek() == ("op", "!"):
            self.take()
            if not (node.is_Integer and 0 <= node <= MAX_FACTORIAL):
                raise AnswerError(f"factorial only of integers 0..{MAX_FACTORIAL}")
            node = self.sp.factorial(node)
        return node

    def atom(self) -> Any:
        sp = self.sp
        kind, val = self.take()
        if kind == "num":
            assert val is not None
            return sp.Rational(val) if any(ch in val for ch in ".eE") else sp.Integer(val)
        if kind == "id":
            assert val is not None
            if val in _FUNCS:
                return self._call(val)
            if val == "pi":
                return sp.pi
            if val == "e":
                return sp.E
            if val == "i":
                return sp.I
            if val in ("oo", "inf", "infty", "infinity"):
                return sp.oo
            return sp.Symbol(val)
        if (kind, val) == ("op", "("):
            node = self.expr()
            if self.take() != ("op", ")"):
                raise AnswerError("missing ')'")
            return node
        raise AnswerError(f"unexpected {val!r}" if val else "unexpected end")

    def _call(self, name: str) -> Any:
        fn, arities = self.funcs[name]
        if self.peek() == ("op", "("):
            self.take()
            args = [self.expr()]
            while self.peek() == ("op", ","):
                self.take()
                args.append(self.expr())
            if self.take() != ("op", ")"):
                raise AnswerError(f"missing ')' after {name}(")
        else:
            args = [self.power()]                    # sqrt2, sin x
        if len(args) not in arities:
            raise AnswerError(f"{name} takes {' or '.join(map(str, arities))} arguments")
        if name == "binomial":
            n, k = args
            if not (n.is_Integer and k.is_Integer and 0 <= n <= MAX_BINOMIAL):
                raise AnswerError(f"binomial only of integers up to {MAX_BINOMIAL}")
            return self.sp.binomial(n, k)
        if name == "log" and len(args) == 2:
            return self.sp.log(args[0], args[1])
        return fn(*args)

    def _pow(self, base: Any, exp: Any) -> Any:
        sp = self.sp
        if base.is_Rational and exp.is_Rational:
            # The exact value of p/q ^ a/b has about |a/b| * log2(max(|p|, |q|)) bits.
            size = max(abs(base.p), abs(base.q)).bit_length()
            if size > 1 and abs(exp) * size > MAX_POW_BITS:
                raise AnswerError("a power too large to evaluate exactly")
            if base == 0 and exp.is_negative:
                raise AnswerError("division by zero")
        elif exp.is_Rational and abs(exp) > MAX_POW_BITS and base.is_number and base not in (0, 1, -1):
            raise AnswerError("a power too large to evaluate exactly")     # sqrt(2)^(10^9) = 2^(5*10^8)
        return sp.Pow(base, exp)


def parse_expression(text: str) -> Any:
    """A sympy expression from plain text (output of latex_to_plain), built without eval."""
    return _Parser(tokenize(text)).parse()


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

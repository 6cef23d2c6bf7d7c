"""`math`: a reasoner and a tool agent solve a math problem together (paper §5.3).

Each turn the agents act in `turn_order` (default `("tool", "reasoner")`, sequential: the
reasoner sees the tool agent's program and output of the same turn).

- **tool** writes one ```python block. It runs in the sandbox (no network, the Python standard
  library only); the last non-empty line of its stdout is its answer (`\\boxed{...}` or
  `Answer: ...` on that line are unwrapped). Local reward: +1 when that answer is right, 0 when it
  is wrong or nothing was printed, `failure_reward` (option, default -1) for no code block or a
  program that crashes or runs past `tool_timeout_s` (the reference's +1 / 0 / -1).
- **reasoner** ends its answer with `\\boxed{...}` (the last box counts; a `Final answer: ...`
  line is accepted when there is no box). Local reward: +1 right, 0 wrong, `failure_reward` when
  no answer can be found.
- **team reward** (both agents): 1.0 while the reasoner's latest answer is right, else 0.0. With
  alpha = 1 the reasoner earns 2 x correct and the tool agent own +1/0/-1 + the reasoner's
  correctness: the reference's rewards.
- **done / success**: success = the reasoner's latest answer is right. `done_when: correct` (the
  default) ends the episode when it is; `done_when: agree` ends it when the reasoner's and the
  tool's answers agree mathematically (the reference), scored by correctness all the same. The
  reference's "agree" alone let two agents end an episode with a shared wrong answer; ours never
  pays for that, and by default does not end on it either. Note that under `correct` a second
  turn tells the agents their first answer was wrong (an oracle); evaluate with `max_turns: 1`
  or `done_when: agree` for oracle-free numbers.

Answers are compared as mathematics, not strings (`answers_match`): `1/2` = `0.5` =
`\\frac{1}{2}`, `\\sqrt{8}` = `2\\sqrt{2}`, `(x-1)(x+1)` = `x^2-1`, numbers within a relative
tolerance (`rel_tol`, default 1e-6), intervals `(0, 1]` (brackets must match), unions of
intervals, sets `\\{1, 2\\}` = `{2, 1}` and comma lists in any order, tuples in order, `x = 3` =
`3`, units and `^\\circ` ignored, and text answers compared case-insensitively.

**Safety.** Model text never reaches `eval`, `sympify` or `parse_expr` (which eval). LaTeX is
rewritten by a small scanner, then a whitelist tokenizer (numbers, single-letter variables, a fixed
list of function and constant names, `+ - * / ^ ( ) , !`) and a recursive-descent parser build the
sympy expression node by node. Bounds: 400 characters per answer, 300 tokens, nesting depth 50,
100-digit literals, powers whose exact value would exceed 20,000 bits, factorials above 300 and
binomials above 1,000 are refused (the answer then only matches an identical string). Equality is
decided by numeric evaluation at 30 digits (at fixed sample points when variables occur), never by
`simplify`, so a check takes milliseconds.

Options: the problem source (`dataset`, `path`, `train`/`eval`, `start`/`stop`; see
env_svc/datasets.py), `max_turns` (4, the reference's), `turn_order` (e.g. `[reasoner]` for a
single-agent L0 run), `parallel`, `done_when`, `failure_reward`, `tool_timeout_s` (5),
`rel_tol`, `abs_tol` (1e-9).
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atgrpo.errors import AtgrpoError, FailedPrecondition, InvalidArgument
from atgrpo.sdk.env import EVAL_SEED_OFFSET, Environment, EnvSpec, Message, StepResult
from env_svc import datasets
from env_svc.envs._text import clip as _clip
from env_svc.envs._text import decode as _decode
from env_svc.envs._text import program_lines

try:  # the sandbox's plain types; an environment served without sandbox_svc still imports
    from sandbox_svc.model import Limits
except ImportError:  # pragma: no cover
    Limits = None  # type: ignore[assignment,misc]

AGENTS = ("tool", "reasoner")
FAILURE_REWARD = -1.0
CODE_CHARS, STDOUT_CHARS, STDERR_CHARS = 1500, 800, 400
SANDBOX_WAIT_S = 300.0      # how long a step waits for a busy or restarting sandbox

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


# ---------------------------------------------------------------------------------------------
# The environment


async def sandbox_call(fn: Any, *args: Any, wait_s: float = SANDBOX_WAIT_S, **kwargs: Any) -> Any:
    """A sandbox call, retried with jittered backoff (the server's retry hint when it gives one)
    while the sandbox is busy or unavailable, for up to `wait_s`: tree sampling sends K branches
    of many tasks at once, more than a sandbox queues, and waiting is the answer to that. Other
    errors, and the last one after `wait_s`, propagate: the episode then fails, so no sample gets
    a reward that no sandbox run computed."""
    deadline = time.monotonic() + wait_s
    attempt = 0
    while True:
        try:
            return await fn(*args, **kwargs)
        except AtgrpoError as e:
            left = deadline - time.monotonic()
            if not e.retryable or left <= 0:
                raise
            hint = e.retry_after_ms / 1000 if e.retry_after_ms else 0.05 * 2 ** min(attempt, 6)
            attempt += 1
            await asyncio.sleep(min(left, min(hint, 5.0) * (0.5 + random.random())))


def turn_options(options: Mapping[str, Any], agents: tuple[str, ...], name: str) -> tuple[tuple[str, ...], bool]:
    order = tuple(options.get("turn_order") or agents)
    if not order or len(set(order)) != len(order) or not set(order) <= set(agents):
        raise ValueError(f"{name}: turn_order {list(order)} must list some of {list(agents)}, each once")
    return order, bool(options.get("parallel", False))


class MathEnv(Environment):
    """A reasoner and a tool agent solve a math problem; answers are checked as mathematics."""

    name = "math"

    def __init__(self, options: Mapping[str, Any] | None = None):
        super().__init__(options)
        order, parallel = turn_options(self.options, AGENTS, self.name)
        self.spec = EnvSpec(self.name, agents=order, turn_order=order,
                            max_turns=int(self.options.get("max_turns", 4)), parallel=parallel,
                            description="a reasoner and a tool agent solve a math problem")
        self.sources = datasets.sources(self.options, "math")
        self.done_when = str(self.options.get("done_when", "correct"))
        if self.done_when not in ("correct", "agree"):
            raise ValueError(f"math: done_when must be 'correct' or 'agree', got {self.done_when!r}")
        self.failure_reward = float(self.options.get("failure_reward", FAILURE_REWARD))
        self.rel_tol = float(self.options.get("rel_tol", 1e-6))
        self.abs_tol = float(self.options.get("abs_tol", 1e-9))
        timeout_ms = int(float(self.options.get("tool_timeout_s", 5.0)) * 1000)
        if timeout_ms <= 0:
            raise ValueError("math: tool_timeout_s must be > 0")
        self.limits = None if Limits is None else Limits(
            wall_timeout_ms=timeout_ms, cpu_time_ms=timeout_ms, memory_bytes=512 * 2**20,
            max_output_bytes=64 * 2**10, max_processes=16, max_file_bytes=2**20, max_open_files=64)
        self.problem: datasets.MathProblem | None = None
        self.turn = 0
        self.acted: set[str] = set()
        self.done = self.success = False
        self.answer: str | None = None          # the reasoner's latest answer
        self.tool_answer: str | None = None     # the tool program's latest answer
        self.tool_out: dict[str, Any] | None = None   # this turn's tool output
        self.history: list[str] = []
        self.notes: dict[str, str] = {}         # this turn's one-line summary per agent

    # ---- Environment ------------------------------------------------------------------------

    def reset(self, task_id: str, seed: int, split: str) -> None:
        if importlib.util.find_spec("sympy") is None:
            raise FailedPrecondition("the math env checks answers with sympy, which is not installed: "
                                     "`pip install sympy` where env_svc runs")
        try:
            problems = datasets.load("math", self.sources[split], split)
        except datasets.DatasetError as e:
            raise InvalidArgument(str(e)) from None
        self.problem = datasets.pick(problems, task_id, seed, split, EVAL_SEED_OFFSET)
        self.turn, self.acted, self.done, self.success = 0, set(), False, False
        self.answer = self.tool_answer = None
        self.tool_out, self.history, self.notes = None, [], {}

    def fork(self) -> MathEnv:
        import copy
        memo = {id(v): v for v in (self.sandbox, self.spec, self.options, self.limits, self.problem, self.sources)}
        return copy.deepcopy(self, memo)

    def observe(self, agent: str) -> list[Message]:
        self._check(agent)
        p = self.problem
        assert p is not None
        multi = len(self.spec.turn_order) > 1
        if agent == "tool":
            role = ("You are the tool agent of a two-agent math team (you and a reasoner): write a Python "
                    "program that computes the answer." if multi else "Write a Python program that computes the answer.")
        else:
            role = ("You are the reasoning agent of a two-agent math team (you and a tool agent who writes "
                    "programs): give the final answer." if multi else "Solve the problem.")
        parts = [f"{role}\nTurn {self.turn + 1} of {self.spec.max_turns}.", f"Problem:\n{p.question}"]
        if self.history:
            parts.append("Previous turns:\n" + "\n".join(self.history[-6:]))
        if agent == "tool":
            parts.append("Write the program in one ```python code block. It runs with Python 3 and its standard "
                         "library only (fractions, math, itertools ...), without input. Print the final answer "
                         "on the last line of the output.")
        else:
            if "tool" in self.spec.turn_order:
                parts.append(self._tool_report())
            parts.append("Reason step by step, then give the final answer in \\boxed{}, e.g. \\boxed{\\frac{3}{4}}.")
        return [{"role": "user", "content": "\n\n".join(parts)}]

    async def step(self, agent: str, action: str) -> StepResult:
        self._check(agent)
        if self.problem is None:
            raise RuntimeError("math: step() before reset()")
        if self.done:
            return StepResult(self._team(), 0.0, True, self.success, {"error": "the episode is over"})
        action = action if isinstance(action, str) else ""
        result = await (self._tool(action) if agent == "tool" else self._reasoner(action))
        self.acted.add(agent)
        if self.acted >= set(self.spec.turn_order):
            self._end_turn()
        return result

    # ---- agents -----------------------------------------------------------------------------

    async def _matches(self, a: str, b: str) -> bool:
        """answers_match off the event loop: sympy is pure Python, and env_svc serves other
        episodes meanwhile."""
        return await asyncio.to_thread(answers_match, a, b, self.rel_tol, self.abs_tol)

    async def _reasoner(self, action: str) -> StepResult:
        ans = extract_answer(action)
        if ans is None:
            self._record("reasoner", "gave no \\boxed{} answer")
            return StepResult(self._team(), self.failure_reward, False, False,
                              {"parse_error": "no \\boxed{...} answer found; end with the final answer in \\boxed{}"})
        self.answer = _clip(ans, 400)
        correct = await self._matches(ans, self.problem.answer)
        self.success = correct
        info: dict[str, Any] = {"answer": self.answer, "correct": correct}
        if self.done_when == "correct":
            self.done = correct
        else:
            agree = self.tool_answer is not None and await self._matches(ans, self.tool_answer)
            info["agree"] = agree
            self.done = agree
        self._record("reasoner", f"answered {_clip(ans, 200)}")
        return StepResult(self._team(), 1.0 if correct else 0.0, self.done, self.success, info)

    async def _tool(self, action: str) -> StepResult:
        out: dict[str, Any] = {"code": "", "stdout": "", "stderr": "", "answer": None, "error": ""}
        self.tool_out = out
        info: dict[str, Any] = {}

        def fail(key: str, message: str) -> StepResult:
            out["error"] = info[key] = message
            self._record("tool", f"failed ({_clip(message, 120)})")
            return StepResult(self._team(), self.failure_reward, False, False, info)

        code = extract_code(action)
        if code is None:
            return fail("parse_error", "no ```python code block found; put the program in one ```python ... ``` block")
        out["code"] = _clip(code.strip(), CODE_CHARS)
        if self.sandbox is None:
            raise FailedPrecondition("the math env's tool agent runs code, but no sandbox is configured: start "
                                     "env_svc with --sandbox HOST:PORT (local mode does this)")
        kwargs = {} if self.limits is None else {"limits": self.limits}
        try:
            result = await sandbox_call(self.sandbox.execute, code, **kwargs)
        except InvalidArgument as e:           # the program itself is unacceptable (e.g. a NUL byte)
            return fail("exec_error", f"the sandbox refused the program: {e}")
        stdout, stderr = _decode(getattr(result, "stdout", b"")), _decode(getattr(result, "stderr", b""))
        out["stdout"], out["stderr"] = _clip(stdout.strip(), STDOUT_CHARS), _clip(stderr.strip(), STDERR_CHARS)
        verdict = getattr(getattr(result, "verdict", None), "value", str(getattr(result, "verdict", "")))
        info["verdict"] = verdict
        if verdict != "ok":
            tail = _clip(stderr.strip().splitlines()[-1], 200) if stderr.strip() else "no stderr"
            what = {"timeout": "ran past its time limit", "memory_limit": "ran out of memory",
                    "output_limit": "printed too much"}.get(verdict, f"failed (exit code {getattr(result, 'exit_code', '?')})")
            return fail("exec_error", f"the program {what}: {tail}")
        ans = stdout_answer(stdout)
        if ans is None:
            out["error"] = "the program printed nothing"
            self._record("tool", "printed nothing")
            return StepResult(self._team(), 0.0, False, False, {**info, "answer": None, "correct": False})
        out["answer"] = self.tool_answer = _clip(ans, 400)
        correct = await self._matches(ans, self.problem.answer)
        info.update(answer=self.tool_answer, correct=correct)
        self._record("tool", f"printed {_clip(ans, 200)}")
        if self.done_when == "agree" and self.answer is not None and "reasoner" in self.acted:
            agree = await self._matches(ans, self.answer)
            info["agree"] = agree
            self.done = agree
        return StepResult(self._team(), 1.0 if correct else 0.0, self.done, self.success, info)

    # ---- helpers ----------------------------------------------------------------------------

    def _tool_report(self) -> str:
        out = self.tool_out
        if out is None:
            return "The tool agent has not acted this turn."
        lines = program_lines(out, "Its output", "Its errors")
        lines.append(f"The tool agent's answer: {out['answer']}" if out["answer"] is not None
                     else f"The tool agent gave no answer: {out['error']}")
        return "\n".join(lines)

    def _record(self, agent: str, text: str) -> None:
        self.notes[agent] = text

    def _end_turn(self) -> None:
        line = "; ".join(f"{a} {self.notes[a]}" for a in self.spec.turn_order if a in self.notes)
        self.history.append(f"Turn {self.turn + 1}: {line}")
        self.notes = {}
        self.turn += 1
        self.acted = set()
        self.tool_out = None

    def _team(self) -> float:
        return 1.0 if self.success else 0.0

    def _check(self, agent: str) -> None:
        if agent not in self.spec.agents:
            raise ValueError(f"math: unknown agent {agent!r}; this environment's agents are {self.spec.agents}")

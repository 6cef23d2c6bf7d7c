"""Plain-text math expressions to sympy, without eval: a whitelist tokenizer and a
recursive-descent parser that build the expression node by node, checking each with the numeric
evaluator (answer_eval.py); both bounded (the MAX_* limits of answer_limits.py, shared by the
LaTeX scanner and answers.py). Input is the plain syntax latex_to_plain (answer_latex.py) produces.

Why bounds everywhere: sympy computes exactly as it builds (`9**9**9` is a 350-million-digit
integer; `sqrt(n)` factors n, seconds for a 10,000-bit n), decides what a number is (zero?
positive?) by evaluating it again at every enclosing node (nested logs: exponential in depth), and
mpmath raises a number to any power it is given. So sympy only ever sees rationals, variables and
opaque numbers (opaque_type: every other number, hidden behind a Dummy), values come from the
bounded Evaluator alone, and each operation is checked *before* sympy or mpmath runs it: the bits
of every exact number, the bits of a number whose root sympy would take, the magnitude of every
numeric value (from its operands' values at 64 bits, for a power from |exp * ln base|),
factorials, binomials, trig arguments, tokens, nesting. An answer past a bound raises JudgeError
(too_large, too_deep), an undefined one (`0/0`, `oo - oo`, `log 0`, infinity inside arithmetic)
JudgeError("undefined"); text that is not mathematics raises AnswerError and is then compared as
text.
"""

from __future__ import annotations

import math
import re
from typing import Any

from env_svc.envs.answer_eval import Evaluator, Unbounded, hide, variables
from env_svc.envs.answer_limits import (
    MAX_BINOMIAL,
    MAX_DEPTH,
    MAX_DIGITS,
    MAX_FACTORIAL,
    MAX_POW_BITS,
    MAX_ROOT_BITS,
    MAX_TOKENS,
    AnswerError,
    too_deep,
    too_large,
    undefined,
)
from env_svc.envs.math_names import MATH_FUNCTIONS


def _funcs() -> dict[str, tuple[Any, tuple[int, ...]]]:
    import sympy as sp

    return {
        "sqrt": (sp.sqrt, (1,)),
        "cbrt": (sp.cbrt, (1,)),
        "exp": (sp.exp, (1,)),
        "ln": (sp.log, (1,)),
        "log": (sp.log, (1, 2)),
        "sin": (sp.sin, (1,)),
        "cos": (sp.cos, (1,)),
        "tan": (sp.tan, (1,)),
        "cot": (sp.cot, (1,)),
        "sec": (sp.sec, (1,)),
        "csc": (sp.csc, (1,)),
        "asin": (sp.asin, (1,)),
        "acos": (sp.acos, (1,)),
        "atan": (sp.atan, (1,)),
        "arcsin": (sp.asin, (1,)),
        "arccos": (sp.acos, (1,)),
        "arctan": (sp.atan, (1,)),
        "sinh": (sp.sinh, (1,)),
        "cosh": (sp.cosh, (1,)),
        "tanh": (sp.tanh, (1,)),
        "abs": (sp.Abs, (1,)),
        "floor": (sp.floor, (1,)),
        "ceil": (sp.ceiling, (1,)),
        "binomial": (None, (2,)),
    }


# The shared names, and those this parser builds itself, bounded (answer_eval): the arc-
# spellings, cube root, floor, ceiling and binomials up to MAX_BINOMIAL. rg_safe's gate in front
# of sympy's own parser does not take these.
_FUNCS = MATH_FUNCTIONS | {"cbrt", "arcsin", "arccos", "arctan", "floor", "ceil", "binomial"}
_CONSTS = {"pi", "e", "i", "oo", "inf", "infty", "infinity", "nan"}
_INFINITIES = {"oo", "inf", "infty", "infinity"}
# names found inside a run of letters (xsin = x sin); an infinity or nan only as a whole word, so
# that "book" or "banana" stay text, not an infinity or an undefined value
_NAMES = sorted((n for n in _FUNCS | {"pi"} if len(n) > 1), key=len, reverse=True)
_TOKEN_RE = re.compile(
    r"\s*+(?:((?:\d++(?:\.\d*+)?|\.\d++)(?:[eE][+-]?\d++(?![A-Za-z]))?)|([A-Za-z]++)|(\*\*|[-+*/^(),!]))"
)


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
            _check_literal(num)
            tokens.append(("num", num))
        elif op is not None:
            tokens.append(("op", "^" if op == "**" else op))
        else:
            tokens += _split_word(word)
        if len(tokens) > MAX_TOKENS:
            raise too_large(f"expression (over {MAX_TOKENS} tokens)")
    return tokens


def _check_literal(num: str) -> None:
    """A number literal sympy may build exactly: at most MAX_DIGITS characters and an exponent
    (1e999) of at most three digits (Rational("1e99999") is a 330,000-bit integer)."""
    exponent = re.split(r"[eE][+-]?", num)[1:]
    if len(num) > MAX_DIGITS or exponent and len(exponent[0]) > 3:
        raise too_large(f"number literal (over {MAX_DIGITS} characters, or an exponent over 999)")


def _split_word(word: str) -> list[tuple[str, str]]:
    """A run of letters: known names (longest first) and single-letter variables; a word of 4+
    letters with no known name in it is text, not algebra."""
    if word in _FUNCS or word in _CONSTS:
        return [("id", word)]
    if word.lower() == "nan":
        return [("id", "nan")]
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


# ---- the parser --------------------------------------------------------------------------------


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary | implicit power)* ;
    unary := ('-'|'+') unary | power ; power := postfix ('^' unary)? ; postfix := atom '!'* ;
    atom := number | name | name '(' args ')' | func power | '(' expr ')'.

    Every node goes through `_checked` (exact sizes and magnitude after it is built, and a number
    that is not rational hidden from sympy: opaque_type) and every power, root and factorial
    through a check before it is built."""

    def __init__(self, tokens: list[tuple[str, str]]):
        import sympy as sp

        self.sp, self.t, self.i, self.depth = sp, tokens, 0, 0
        self.funcs = _funcs()
        self.approx = Evaluator(64)
        self.bits_memo: dict[Any, int] = {}
        self.infinite = False  # an infinity was written somewhere

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
        sp = self.sp
        if node.has(sp.nan, sp.zoo):
            raise undefined("not a number, or a division by zero")
        if self.infinite and node not in (sp.oo, -sp.oo):
            raise undefined("infinity inside arithmetic")  # 1/oo = 0, e^-oo = 0: no limits here
        return node

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise too_deep()

    def expr(self) -> Any:
        self._enter()
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            rhs = self.term()
            node = self._checked(node + rhs if op == "+" else node - rhs)
        self.depth -= 1
        return node

    def term(self) -> Any:
        node = self.unary()
        while True:
            kind, val = self.peek()
            if (kind, val) == ("op", "*"):
                self.take()
                node = self._mul(node, self.unary())
            elif (kind, val) == ("op", "/"):
                self.take()
                d = self.unary()
                if d == 0:
                    raise undefined("division by zero")
                node = self._mul(node, self._pow(d, self.sp.Integer(-1)))
            elif kind in ("num", "id") or (kind, val) == ("op", "("):
                node = self._mul(node, self.power())  # implicit multiplication: 2x, (x-1)(x+1)
            else:
                return node

    def unary(self) -> Any:
        if self.peek() in (("op", "-"), ("op", "+")):
            sign = self.take()[1]
            self._enter()  # "- - - ... 1" recurses too
            node = self.unary()
            self.depth -= 1
            return self._checked(-node) if sign == "-" else node
        return self.power()

    def power(self) -> Any:
        base = self.postfix()
        if self.peek() == ("op", "^"):
            self.take()
            self._enter()
            exp = self.unary()
            self.depth -= 1
            return self._pow(base, exp)
        return base

    def postfix(self) -> Any:
        node = self.atom()
        while self.peek() == ("op", "!"):
            self.take()
            node = self._combinatorial(self.sp.factorial, node)
        return node

    def _combinatorial(self, fn: Any, n: Any, *k: Any) -> Any:
        """n! or binomial(n, k): exact for integers (n up to MAX_FACTORIAL or MAX_BINOMIAL),
        unevaluated for variables (n(n-1)/2 = binomial(n, 2) at the sample points), text for
        other numbers."""
        limit = MAX_FACTORIAL if fn is self.sp.factorial else MAX_BINOMIAL
        args = (n, *k)
        if any(variables(a) for a in args):
            return self._checked(fn(*args, evaluate=False))
        if not all(a.is_Integer for a in args):
            raise AnswerError(f"{fn.__name__} of a number that is not an integer")
        if n > limit:
            raise too_large(f"{fn.__name__} (only of integers up to {limit})")
        if n < 0:
            raise undefined(f"{fn.__name__} of a negative number")
        return self._checked(fn(*args))

    def atom(self) -> Any:
        sp = self.sp
        kind, val = self.take()
        if kind == "num":
            assert val is not None
            return self._checked(
                sp.Rational(val) if any(ch in val for ch in ".eE") else sp.Integer(val)
            )
        if kind == "id":
            assert val is not None
            if val in _FUNCS:
                return self._call(val)
            if val in _INFINITIES:
                self.infinite = True
                return sp.oo
            if val == "nan":
                raise undefined("nan")
            const = {"pi": sp.pi, "e": sp.E, "i": sp.I}.get(val)
            return sp.Symbol(val) if const is None else self._checked(const)
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
            self._enter()  # sin sin sin ... x recurses too
            args = [self.power()]  # sqrt2, sin x
            self.depth -= 1
        if len(args) not in arities:
            raise AnswerError(f"{name} takes {' or '.join(map(str, arities))} arguments")
        if name == "binomial":
            return self._combinatorial(self.sp.binomial, *args)
        if name in ("sqrt", "cbrt"):
            return self._pow(args[0], self.sp.Rational(1, 2 if name == "sqrt" else 3))
        if name == "log" and len(args) == 2:  # log(x, b) = log x / log b
            return self._mul(
                self._apply(fn, args[0]), self._pow(self._apply(fn, args[1]), self.sp.Integer(-1))
            )
        return self._apply(fn, args[0])

    # ---- the checks ---------------------------------------------------------------------------

    def _apply(self, fn: Any, arg: Any) -> Any:
        """fn(arg), left unevaluated: sympy simplifies a function of a number by evaluating it
        numerically, again at each level of nesting and more precisely each time (log(log(...
        log(3))) nine deep took seconds, twelve deep hours). Values come from the evaluator, and
        sin(pi/6) = 1/2 is decided numerically like everything else."""
        return self._checked(fn(arg, evaluate=False))

    def _mul(self, a: Any, b: Any) -> Any:
        return self._checked(a * b)

    def _pow(self, base: Any, exp: Any) -> Any:
        """base ^ exp, refused before sympy computes it when the result is too large: exact
        integer powers cost |exp| * bits(base) bits; roots factor their base; a numeric value's
        magnitude comes from |exp * ln base| (never from the value)."""
        sp = self.sp
        if exp.is_Rational:
            if abs(exp) * self._log2_size(base) > MAX_POW_BITS and base not in (0, 1, -1):
                raise too_large("power")
            if not exp.is_Integer and max(self._bits(base), self._bits(exp)) > MAX_ROOT_BITS:
                raise too_large("root")
        if base == 0 and exp.is_negative:
            raise undefined("division by zero")
        numeric_exp = not variables(exp)
        if numeric_exp and not variables(base):
            self._bound(lambda: self.approx.power(self._approx(base), self._approx(exp)), "power")
        elif numeric_exp and not exp.is_Rational and abs(self._approx(exp)) > MAX_POW_BITS:
            raise too_large("power")  # x^(pi * 10^9)
        return self._checked(sp.Pow(base, exp))

    def _checked(self, node: Any) -> Any:
        """node, refused when sympy built it too large (an exact number over MAX_POW_BITS bits, a
        numeric value past 2^MAX_MAG_BITS, an undefined one), and hidden (opaque_type) when it is
        a number sympy would evaluate: not rational, not an infinity."""
        if self._bits(node) > MAX_POW_BITS:
            raise too_large("exact number")
        if not variables(node):
            self._approx(node)
        if node.is_number and not (node.is_Rational or node in (self.sp.oo, -self.sp.oo)):
            node = hide(node)
        return node

    def _approx(self, node: Any) -> Any:
        """node's value at 64 bits (node has no variables)."""
        return self._bound(lambda: self.approx.value(node), "value")

    @staticmethod
    def _bound(fn: Any, what: str) -> Any:
        try:
            return fn()
        except Unbounded as e:
            raise (undefined(str(e)) if e.reason == "undefined" else too_large(what)) from None

    def _bits(self, node: Any) -> int:
        """The most bits of any exact number in node (numerators and denominators)."""
        got = self.bits_memo.get(node)
        if got is None:
            if node.is_Rational:
                got = max(abs(node.p).bit_length(), node.q.bit_length())
            else:
                got = max((self._bits(a) for a in node.args), default=0)
            self.bits_memo[node] = got
        return got

    def _log2_size(self, base: Any) -> float:
        """About the bits of base^1 as sympy would build base^n exactly (n * this): log2 of a
        rational's larger part, else the largest exact number in it (at least 1: x^n costs n)."""
        if base.is_Rational:
            return math.log2(max(abs(base.p), base.q, 2))
        return max(self._bits(base), 1)


def parse_expression(text: str) -> Any:
    """A sympy expression from plain text (output of latex_to_plain), built without eval and
    within bounds (JudgeError past them, AnswerError for text that is not mathematics)."""
    try:
        return _Parser(tokenize(text)).parse()
    except RecursionError:
        raise too_deep() from None

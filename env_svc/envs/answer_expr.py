"""Plain-text math expressions to sympy, without eval: a whitelist tokenizer and a
recursive-descent parser that build the expression node by node, within size bounds (the
MAX_* limits below, shared by the LaTeX scanner and answers.py). Input is the plain syntax
latex_to_plain (answer_latex.py) produces.
"""

from __future__ import annotations

import re
from typing import Any

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

"""Our own scorers for the reasoning-gym datasets whose `score_answer` runs the answer as code or
pays wrong answers, run in the env's process because they only parse data (DESIGN.md 4b).

What an audit of reasoning-gym 0.1.19's scorers found (grep for eval, exec, parse_expr, sympify,
literal_eval and substring credit in every dataset's score_answer), and what we do about each:

- `eval(answer)` on the model's text: **spiral_matrix**, **n_queens**, **binary_matrix**,
  **string_insertion** (an alternative "Python list" answer form earning partial credit). Ours
  read that form with `judge.literal` (data only, bounded) and pay as the dataset does.
- sympy `parse_expr(answer)` (an eval) on arithmetic: **countdown**, **puzzle24**. Ours parse
  numbers, + - * / and parentheses only (`arithmetic`), exactly, with fractions. Gaps closed:
  countdown counted numbers with the regex \\b\\d+\\b, so `0e0`, `1e2` or `1.0` slipped past its
  "uses exactly the puzzle's numbers" check; puzzle24 never checked the numbers were the puzzle's
  (any four from its range) and truncated the value with int() (24.5 scored as 24).
- sympy `parse_expr(answer)` on symbolic answers: **polynomial_multiplication**,
  **simple_integration**, **intermediate_integration**. The dataset's scorer still runs, in the
  scorer worker (rg_scorer.py), and only after `math_text` has refused any answer that is not
  plain mathematics (no quotes, dots outside numbers, underscores or unknown names), so the text
  sympy evaluates can name nothing but numbers, symbols and math functions. Gap closed: the
  integration scorers differentiate the answer, so `Integral(f, x) + C` (sympy's unevaluated
  integral, also 1 in 8 of intermediate_integration's own reference answers) scored 1.0 on every
  question; `Integral` is not a name the gate lets through.
- substring partial credit (`oracle in answer` paid len(oracle)/len(answer)): the base class's
  default scorer, used by 33 datasets (basic_arithmetic, gcd, leg_counting, maze, ...), and
  **chain_sum**, **products** (utils.compute_decimal_reward): the wrong answer "12" earned 0.5
  where the right one was "2". Ours pay the exact answer only (chain_sum and products: equal as
  decimals).
- a verdict of 1.0 for wrong answers: **game_of_life_halting** compared bool(answer) with
  bool(reference), two non-empty strings, so any answer scored 1.0; **coin_flip** paid any
  answer within 1e-4 of the probability ("0" when it is under 1e-4) and credited a matching
  prefix over the shorter length ("0" earned 1.0 against "0.3125"). Ours compare True/False,
  and the probability within 1e-4 and 1%.
- format rewards: countdown and puzzle24 paid 0.05 and 0.01 for any well-formed expression, the
  constant "1" included; ours pay 0 for a wrong one. Every other dataset's partial credit is
  settled in rg_credit.py (its verdict of right, or nothing, unless audited as progress).
- left as the dataset's (in the worker), noted: number_sorting accepts any value within 1 of
  the right one, and eval()s its own reference answer (not the model's text).

Every scorer here takes (dataset, answer, entry), returns the dataset's score for an honest
answer less its format rewards (tests/env/test_integrity_reasoning_gym.py checks that on the
datasets' own references and honest variants), and raises JudgeError for an answer it refuses to
read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from atgrpo.sdk.judge import JudgeError, literal
from env_svc.envs.math_names import MATH_FUNCTIONS

MAX_EXPR_CHARS = 1000  # countdown's six numbers with operators and brackets take under 100
MAX_EXPR_TOKENS = 200
MAX_EXPR_DEPTH = 32  # brackets and unary signs inside each other
MAX_INT_DIGITS = 12  # the puzzles' numbers are small; a long one is not the puzzle's

Scorer = Callable[[Any, str, dict], float]

# ---- a safe arithmetic parser ----------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*(?:([-+*/()])|([0-9A-Za-z_.]+)|(\S))", re.ASCII)
_INT_RE = re.compile(r"0|[1-9][0-9]*", re.ASCII)


@dataclass
class Arithmetic:
    """An answer read as arithmetic: its exact value, the integers it is written with (in order)
    and the binary operators it uses."""

    value: Fraction = Fraction(0)
    numbers: list[int] = field(default_factory=list)
    operators: set[str] = field(default_factory=set)


def _tokens(text: str) -> list[str]:
    if len(text) > MAX_EXPR_CHARS:
        raise JudgeError(
            "too_large", f"the expression is {len(text)} characters, over {MAX_EXPR_CHARS}"
        )
    tokens: list[str] = []
    for m in _TOKEN_RE.finditer(text.strip()):
        op, word, other = m.groups()
        if other is not None:
            raise JudgeError(
                "not_data", f"{other!r} is not arithmetic: use numbers, + - * / and parentheses"
            )
        if word is not None and (not _INT_RE.fullmatch(word) or len(word) > MAX_INT_DIGITS):
            # 0e0, 1.0, 01, 1_0, 0x1 or a name: only the puzzle's numbers, written plainly, count
            raise JudgeError(
                "not_data",
                f"{word!r} is not a plain integer; write the puzzle's numbers as they are",
            )
        tokens.append(op or word)
        if len(tokens) > MAX_EXPR_TOKENS:
            raise JudgeError("too_large", f"the expression has over {MAX_EXPR_TOKENS} tokens")
    if not tokens:
        raise JudgeError("not_data", "the answer is empty; write an arithmetic expression")
    return tokens


class _Parser:
    """Recursive descent over the tokens: expr := term (+|- term)*, term := unary (*|/ unary)*,
    unary := (+|-) unary | integer | ( expr ). Exact (Fraction); depth-bounded."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.i, self.out = tokens, 0, Arithmetic()

    def parse(self) -> Arithmetic:
        self.out.value = self.expr(0)
        if self.i != len(self.tokens):
            raise JudgeError("not_data", f"unexpected {self.tokens[self.i]!r} in the expression")
        return self.out

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise JudgeError("not_data", "the expression ends too early")
        self.i += 1
        return token

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            self.out.operators.add(op)
            right = self.term(depth)
            value = value + right if op == "+" else value - right
        return value

    def term(self, depth: int) -> Fraction:
        value = self.unary(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            self.out.operators.add(op)
            right = self.unary(depth)
            if op == "/" and right == 0:
                raise JudgeError("not_data", "the expression divides by zero")
            value = value * right if op == "*" else value / right
        return value

    def unary(self, depth: int) -> Fraction:
        if depth > MAX_EXPR_DEPTH:
            raise JudgeError("too_deep", f"the expression nests more than {MAX_EXPR_DEPTH} deep")
        token = self.take()
        if token in ("+", "-"):
            value = self.unary(depth + 1)
            return -value if token == "-" else value
        if token == "(":
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise JudgeError("not_data", "a bracket is not closed")
            return value
        if token[0].isdigit():
            self.out.numbers.append(int(token))
            return Fraction(int(token))
        raise JudgeError("not_data", f"unexpected {token!r} in the expression")


def arithmetic(text: str, operators: Any = "+-*/") -> Arithmetic:
    """`text` read as arithmetic on plain integers (JudgeError otherwise); a binary operator
    outside `operators` (what the puzzle allows) is refused too."""
    out = _Parser(_tokens(text)).parse()
    if banned := out.operators - set(operators):
        raise JudgeError(
            "not_data",
            f"this puzzle does not allow {''.join(sorted(banned))}; use {' '.join(operators)}",
        )
    return out


# ---- the safe scorers ------------------------------------------------------------------------


def score_countdown(dataset: Any, answer: str, entry: dict) -> float:
    """countdown: 1.0 for the target from all the puzzle's numbers, each once; 0 for any other
    expression (the dataset paid 0.05, which the constant "1" collected on every puzzle)."""
    meta = entry["metadata"]
    expr = arithmetic(answer, dataset.config.operators)
    right = sorted(expr.numbers) == sorted(meta["numbers"]) and expr.value == meta["target"]
    return 1.0 if right else 0.0


def score_puzzle24(dataset: Any, answer: str, entry: dict) -> float:
    """puzzle24: 1.0 for exactly 24 from the puzzle's four numbers, each once; 0 otherwise (the
    dataset paid 0.01)."""
    expr = arithmetic(answer, dataset.config.operators)
    right = sorted(expr.numbers) == sorted(entry["metadata"]["numbers"]) and expr.value == 24
    return 1.0 if right else 0.0


def _data(answer: str) -> Any:
    """The answer as a data literal, or None when it is not one (the datasets' eval() then failed
    and they paid nothing); a literal too large to read is still a judge error."""
    try:
        return literal(answer, "the answer")
    except JudgeError as e:
        if e.reason == "not_data":
            return None
        raise


def _joined(value: Any, sep: str, item: Callable[[Any], str] = str) -> str | None:
    """sep.join(item(x) for x in value), or None where that fails (the datasets' except clauses
    paid 0 then; ValueError: str() of an int over Python's digit limit)."""
    try:
        return sep.join(item(x) for x in value)
    except (TypeError, ValueError):
        return None


def _str_only(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError("not a string")  # what str.join of a non-string raised in the dataset
    return x


def _grid(value: Any, cell: Callable[[Any], str]) -> str | None:
    """Rows of cells as the datasets print a board: cells joined by spaces, rows by newlines."""
    return _joined(value, "\n", lambda row: _must(_joined(row, " ", cell)))


def _must(text: str | None) -> str:
    if text is None:
        raise TypeError("not a row")
    return text


def score_spiral_matrix(dataset: Any, answer: str, entry: dict) -> float:
    oracle, answer = entry["answer"].strip(), answer.strip()
    if answer == oracle:
        return 1.0
    return 0.1 if _joined(_data(answer), " ") == oracle else 0.0  # the numbers as a Python list


def score_n_queens(dataset: Any, answer: str, entry: dict) -> float:
    valid = entry["metadata"]["valid_answers"]
    if answer in valid:
        return 1.0
    return 0.5 if _grid(_data(answer), _str_only) in valid else 0.0  # a list of rows of "Q"/"_"


def score_binary_matrix(dataset: Any, answer: str, entry: dict) -> float:
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    return 0.1 if _grid(_data(answer), str) == oracle else 0.0  # a list of lists of numbers


def score_string_insertion(dataset: Any, answer: str, entry: dict) -> float:
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    return 0.1 if _joined(_data(answer), "", _str_only) == oracle else 0.0  # a list of characters


def score_exact(dataset: Any, answer: str, entry: dict) -> float:
    """The base class's scorer without its substring credit: the exact answer or nothing."""
    return 1.0 if answer.strip() == str(entry["answer"]).strip() else 0.0


def score_decimal(dataset: Any, answer: str, entry: dict) -> float:
    """chain_sum, products: equal as decimals (commas dropped, as the dataset does), without its
    substring credit."""
    if answer == entry["answer"]:
        return 1.0
    try:
        return (
            1.0
            if Decimal(answer.replace(",", "")) == Decimal(entry["answer"].replace(",", ""))
            else 0.0
        )
    except (ArithmeticError, ValueError):  # not a number (or a signalling NaN)
        return 0.0


def score_game_of_life_halting(dataset: Any, answer: str, entry: dict) -> float:
    """game_of_life_halting: the question asks for 'True' or 'False'; the dataset compared
    bool(answer) with bool(reference), both non-empty strings, so every answer scored 1.0."""
    return 1.0 if answer.strip().lower() == str(entry["answer"]).strip().lower() else 0.0


_PROBABILITY_RE = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?|[0-9]+/[0-9]+", re.ASCII
)
MAX_NUMBER_CHARS = 64


def _probability(text: str) -> float | None:
    """A decimal or a fraction a/b as a float; None for anything else (and for a/0)."""
    text = text.strip().replace(",", "")
    if len(text) > MAX_NUMBER_CHARS or not _PROBABILITY_RE.fullmatch(text):
        return None
    if "/" in text:
        num, den = text.split("/")
        return int(num) / int(den) if int(den) else None
    return float(text)


def score_coin_flip(dataset: Any, answer: str, entry: dict) -> float:
    """coin_flip: the probability within the dataset's 1e-4, and within 1% of it, so a small one
    needs two significant figures. The dataset's absolute 1e-4 alone paid "0" for any probability
    under 1e-4, and its prefix credit paid "0" 1.0 for any probability under 1 (it divides the
    characters "0" shares with "0.3125" by the shorter length)."""
    value, oracle = _probability(answer), _probability(str(entry["answer"]))
    if value is None or oracle is None:
        return 0.0
    error = abs(value - oracle)
    return 1.0 if value == oracle or (error <= 1e-4 and error <= 0.01 * abs(oracle)) else 0.0


SAFE: dict[str, Scorer] = {
    "countdown": score_countdown,
    "puzzle24": score_puzzle24,
    "spiral_matrix": score_spiral_matrix,
    "n_queens": score_n_queens,
    "binary_matrix": score_binary_matrix,
    "string_insertion": score_string_insertion,
    "chain_sum": score_decimal,
    "products": score_decimal,
    "game_of_life_halting": score_game_of_life_halting,
    "coin_flip": score_coin_flip,
}

# ---- a gate for the symbolic answers sympy reads in the worker -------------------------------

SYMPY_SCORED = frozenset(
    {"polynomial_multiplication", "simple_integration", "intermediate_integration"}
)
# The shared names, pi and sympy's spelling Abs: what the polynomial and integration answers use.
# No more: sympy's parse_expr evaluates whatever a name means (binomial(10**6, 5*10**5) in full).
_MATH_NAMES = MATH_FUNCTIONS | {"pi", "Abs"}
_MATH_RE = re.compile(
    r"\s*(?:([0-9]+(?:\.[0-9]*)?|\.[0-9]+)|([A-Za-z]+)|(\*\*|[-+*/^(),])|(\S))", re.ASCII
)


MAX_EXPONENT = 1000


def math_text(answer: str) -> None:
    """Refuse (JudgeError) an answer that is not plain mathematics before sympy's parse_expr (an
    eval) sees it: numbers, one-letter symbols, the usual functions, operators and brackets; no
    power towers (9**9**9**9) or literal exponents over MAX_EXPONENT, which sympy would compute."""
    if len(answer) > MAX_EXPR_CHARS * 4:
        raise JudgeError(
            "too_large", f"the expression is {len(answer)} characters, over {MAX_EXPR_CHARS * 4}"
        )
    last: list[str] = []  # the tokens so far, for the power rules
    for m in _MATH_RE.finditer(answer):
        number, name, op, other = m.groups()
        if other is not None:
            raise JudgeError("not_data", f"{other!r} does not belong in a mathematical expression")
        if name is not None and len(name) > 1 and name not in _MATH_NAMES:
            raise JudgeError("not_data", f"{name!r} is not a symbol or a known function")
        power = op in ("**", "^")
        if power and len(last) >= 2 and last[-2] in ("**", "^"):
            raise JudgeError(
                "too_large", "a power of a power (a tower) is too large to judge; use brackets"
            )
        if number is not None and last[-1:] in (["**"], ["^"]) and float(number) > MAX_EXPONENT:
            raise JudgeError("too_large", f"an exponent over {MAX_EXPONENT} is too large to judge")
        last = [*last[-1:], number or name or op]


def scorer_for(name: str, dataset: Any) -> Scorer | None:
    """Our in-process scorer for dataset `name`, or None when its own scorer runs in the worker."""
    if name in SAFE:
        return SAFE[name]
    from reasoning_gym.dataset import ProceduralDataset

    if type(dataset).score_answer is ProceduralDataset.score_answer:
        return score_exact
    return None

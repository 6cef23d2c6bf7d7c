"""The bounds every part of the math judge holds an answer to (answer_expr's tokenizer and parser,
answer_eval's evaluator, answer_latex's scanner, answers.py's structures), and the errors an answer
past them raises: JudgeError for one too large, too deep or undefined to judge, AnswerError for
text that is not mathematics (it is then compared as text). Why bounds everywhere: answer_expr.
"""

from __future__ import annotations

import math

from atgrpo.sdk.judge import JudgeError

MAX_ANSWER_CHARS = 400
MAX_TOKENS = 300
MAX_DEPTH = 50  # brackets and exponents inside each other
MAX_DIGITS = 100  # one number literal
MAX_POW_BITS = 20_000  # every exact integer (numerator, denominator) the parser lets sympy build
MAX_ROOT_BITS = 256  # a rational sympy factors to simplify its root (a 256-bit one: milliseconds)
MAX_MAG_BITS = 20_000  # every numeric value lies in 2^-MAX .. 2^MAX (or is 0 or +-oo)
MAX_TRIG_ARG = 2.0**64  # argument reduction of sin(x) costs log2|x| bits of precision
MAX_FACTORIAL = 300
MAX_BINOMIAL = 1_000
MAX_ITEMS = 32
MAX_NODES = 5_000  # nodes one evaluation visits (sympy shares subtrees, so a count, not depth)

_LN2 = math.log(2)


class AnswerError(ValueError):
    """An answer that cannot be read as mathematics (it is then compared as text)."""


def too_large(what: str) -> JudgeError:
    return JudgeError(
        "too_large", f"the answer's {what} is too large to judge; give a simpler exact form"
    )


def too_deep(what: str = "nesting") -> JudgeError:
    return JudgeError("too_deep", f"the answer's {what} is deeper than {MAX_DEPTH} levels")


def undefined(what: str) -> JudgeError:
    return JudgeError("undefined", f"the answer is undefined ({what}); give a value")

"""The function names both math-text parsers let through: answer_expr's judge and rg_safe's gate
before sympy. Security-relevant: a name added here reaches both, so each parser's own additions
stay beside it, with the reason they are its alone. A leaf module, so the judges depend on no
environment."""

MATH_FUNCTIONS = frozenset(
    {
        "sqrt",
        "exp",
        "ln",
        "log",
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "tanh",
        "abs",
    }
)

"""The one allow-list of math function names (env_svc/envs/common.py) that both math-text parsers
read: answer_expr's tokenizer (the math judge) and rg_safe's gate in front of sympy's parse_expr
(reasoning_gym's symbolic datasets). Each parser's own additions are pinned here, so that a name
added to either one is a decision a test records."""

import pytest

from atgrpo.sdk.judge import JudgeError
from env_svc.envs import answer_expr, math_names, rg_safe
from env_svc.envs.answer_expr import tokenize
from env_svc.envs.answer_limits import AnswerError
from env_svc.envs.rg_safe import math_text

JUDGE_ONLY = {"cbrt", "arcsin", "arccos", "arctan", "floor", "ceil", "binomial"}
GATE_ONLY = {"pi", "Abs"}


def test_both_parsers_read_the_same_list():
    assert answer_expr.MATH_FUNCTIONS is math_names.MATH_FUNCTIONS
    assert rg_safe.MATH_FUNCTIONS is math_names.MATH_FUNCTIONS
    assert answer_expr._FUNCS == math_names.MATH_FUNCTIONS | JUDGE_ONLY
    assert rg_safe._MATH_NAMES == math_names.MATH_FUNCTIONS | GATE_ONLY


@pytest.mark.parametrize("name", sorted(math_names.MATH_FUNCTIONS))
def test_a_shared_name_is_a_function_to_both(name):
    assert ("id", name) in tokenize(f"{name}(x)")
    math_text(f"{name}(x) + 1")


@pytest.mark.parametrize("name", sorted(JUDGE_ONLY))
def test_the_judges_own_functions_never_reach_sympy(name):
    """The math judge evaluates these itself, bounded; sympy would compute them unbounded."""
    assert ("id", name) in tokenize(f"{name}(x)")
    with pytest.raises(JudgeError):
        math_text(f"{name}(x)")


@pytest.mark.parametrize("name", ["Integral", "Abs", "factorial", "eval", "exec", "open"])
def test_other_names_are_no_function_to_the_judge(name):
    """A name outside the list is read letter by letter (variables) or refused as a word (then
    compared as text), never as a function."""
    try:
        tokens = tokenize(f"{name}(x)")
    except AnswerError:
        return
    assert ("id", name) not in tokens


@pytest.mark.parametrize("name", ["Integral", "factorial", "eval", "exec", "open", "binomial"])
def test_the_gate_refuses_other_names(name):
    with pytest.raises(JudgeError):
        math_text(f"{name}(x)")

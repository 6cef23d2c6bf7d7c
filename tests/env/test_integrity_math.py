"""Reward integrity of the math env (issue 34): answers written against the judge, not the problem.

Each attack asserts that it earns no credit, and where the judge cannot judge the answer (too large,
too deep, undefined) that it says so (`judge_error` and `parse_error` in the info, counted by the
host) instead of raising out of step; all of it within a generous wall clock, so that an attack
that makes the judge work hard fails here rather than hanging a run. Honest equivalent answers
still score. What the judge guarantees is in env_svc/envs/answers.py's docstring. This file holds
the judge's refusals, what more values earn and the honest answers; crafted input that would make
the judge or the extractors work hard is in test_integrity_math_bounded.py, the env's own handling
of refused answers in test_integrity_math_env.py.

On the code before this suite: `\\sqrt{2}^{\\sqrt{2}^{\\sqrt{2}^{99}}}` raised MemoryError,
`((\\sqrt{2}^{19999})^{19999})^{19999}` ran 24 s then raised MemoryError; `\\sqrt{2^{9999}+1}` took
6 s (sympy factors a root's radicand), nine nested logs 5 s and ten 37 s (sympy re-evaluates each
level); "answer" and 20,000 spaces took 4 s, quadratic, so a megabyte of them hours (a
backtracking regex); and 1000000000 scored as 1000000007 (a relative tolerance).
"""

import pytest

from atgrpo.sdk.judge import JudgeError
from env_svc.envs.answers import answers_match, judge_answer
from tests.env.math_judging import (
    MB,
    timed,
    warm,  # noqa: F401 - an autouse fixture
)


def refused(answer, gold="1"):
    """The JudgeError judge_answer raises for `answer` (failing if it judges it instead)."""
    with pytest.raises(JudgeError) as e:
        timed(judge_answer, answer, gold)
    return e.value


# ---- too large, too deep, undefined: refused with a reason, fast ---------------------------

TOWERS = [
    "\\boxed{9^{9^{9^{9}}}}",
    "9^{9^{9^{9}}}",
    "9**9**9**9",
    "9^9^9^9",
    "2^2^2^2^2^2",
    "(9^9)^(9^9)",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2}}}}",
    "\\sqrt{2}^{\\sqrt{2}^{\\sqrt{2}^{99}}}",
    "((\\sqrt{2}^{19999})^{19999})^{19999}",
    "e^{e^{e^{e^{9}}}}",
    "\\exp(\\exp(\\exp(\\exp(9))))",
    "10^{10^{10^{\\pi}}}",
    "\\pi^{20000}",
    "i^{10^{9}}",
    "(1+2^{-100})^{1000}",
    "(1+\\sqrt{2})^{19999}",
    "2^{0.5^{-100}}",
    "x^{10^{50}}",
    "x^{(9^9)}",
    "(2x)^{20000}",
    "\\sinh(10^{9})",
    "\\sin(10^{99})",
    "2^{19999}\\cdot 2^{19999}",
    "+".join(["2^{19999}"] * 4),
]
# sympy factors radicands
ROOTS = [
    "\\sqrt{2^{9999}+1}",
    "\\sqrt{2^{19999}+1}",
    "(2^{19999}+1)^{1/3}",
    "\\sqrt{2^{1000}+1}",
    "2^{1/2^{300}}",
]
FACTORIALS = ["301!", "((3!)!)!", "1000!", "(10^{6})!", "\\binom{10^{6}}{5}", "300!" * 40]
LITERALS = ["9" * 101, "1e9999", "1" + "0" * 400]


@pytest.mark.parametrize("answer", TOWERS + ROOTS + FACTORIALS + LITERALS)
def test_huge_numbers_are_refused_before_they_are_computed(answer):
    assert refused(answer).reason == "too_large"
    assert not answers_match(answer, "1")


DEEP = [
    "(" * 60 + "1" + ")" * 60,
    "{" * 60 + "1" + "}" * 60,
    "\\sqrt{" * 55 + "2" + "}" * 55,
    "-(" * 55 + "1" + ")" * 55,
    "2^{" * 60 + "2" + "}" * 60,
    "- " * 100 + "1",
    "x^{-" * 55 + "1" + "}" * 55,
]


@pytest.mark.parametrize("answer", DEEP)
def test_deep_nesting_is_refused(answer):
    assert refused(answer).reason == "too_deep"


BIG = [
    "(" * 10_000 + "1" + ")" * 10_000,
    "{" * 10_000 + "1" + "}" * 10_000,
    "\\frac{" * 10_000 + "1" + "}{2}" * 10_000,
    "[" * 10_000 + "]" * 10_000,
    "1" * MB,
    "x+" * (MB // 2) + "1",
    " " * MB + "1",
    "1, " * (MB // 3) + "1",
    "\\{" + ",".join(str(i) for i in range(100)) + "\\}",
    "1+" * 200 + "1",
]


@pytest.mark.parametrize("answer", BIG, ids=lambda a: f"{a[:12]}..{len(a)}")
def test_large_answers_are_refused_fast(answer):
    assert refused(answer).reason == "too_large"


UNDEFINED = [
    "0/0",
    "\\frac{0}{0}",
    "nan",
    "NaN",
    "\\infty - \\infty",
    "0 \\cdot \\infty",
    "\\frac{1}{\\infty}",
    "e^{-\\infty}",
    "\\log 0",
    "\\ln(0)",
    "0^{-1}",
    "\\frac{1}{2^{19999}-2^{19999}}",
    "\\frac{5}{0}",
    "\\tan(\\pi/2) - \\infty",
]


@pytest.mark.parametrize("answer", UNDEFINED)
def test_undefined_answers_are_refused(answer):
    """NaN, 0/0 and infinity inside arithmetic stand for no value: they would equal anything (or,
    through a limit, 0) under a careless comparison."""
    assert refused(answer, "0").reason == "undefined"


def test_infinity_is_a_value_only_for_itself():
    assert answers_match("\\infty", "\\infty") and answers_match("(-\\infty, 2)", "(-\\infty, 2)")
    for gold in ("5", "-\\infty", "0", "10^{100}"):
        assert not judge_answer("\\infty", gold)
    assert not judge_answer("(-\\infty, \\infty)", "(0, 1)")


# ---- more values never earn more ---------------------------------------------------------

HEDGES = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
    "5, 6",
    "5 or 6",
    "5 \\text{ or } 6",
    "5 \\text{or} 6",
    "5, 5",
    "\\{5, 6\\}",
    "\\{5\\} \\cup \\{6\\}",
    "x = 5 = 6",
    "x = 6 = 5",
    "\\pm 5",
    "5 \\pm 1",
    "1, 2, 3, \\ldots, 100",
    "1, 2, ..., 100",
    "(5, 6)",
    "[5, 6]",
    "5 \\lor 6",
    "5 \\vee 6",
    "\\text{the answer is 5 or 6}",
    "\\text{5 or maybe 6}",
    "x \\in \\{5, 6\\}",
    "5 \\text{ (or 6)}",
    "5 and 6",
    "5; 6",
]


@pytest.mark.parametrize("answer", HEDGES)
def test_candidate_lists_earn_nothing(answer):
    try:
        assert not timed(judge_answer, answer, "5")
    except JudgeError as e:
        assert e.reason in ("too_large", "too_deep", "undefined")


def test_a_list_matches_only_the_same_list():
    assert (
        answers_match("5, 6", "6, 5")
        and answers_match("\\{5, 6\\}", "5, 6")
        and answers_match("x = 2+1 = 3", "3")
    )
    for answer in ("5, 6, 7", "5", "5, 6, 6", "5, 5", "\\{5, 6\\} \\cup \\{7\\}", "(5, 6)"):
        assert not judge_answer(answer, "5, 6"), answer
    assert "over 32" in str(refused(",".join(map(str, range(40))), "5"))


def test_an_equation_proves_nothing_by_itself():
    for answer in ("x = x", "0 = 0", "1 = 1", "x + y = x + y", "x^2 + y^2 = x^2 + y^2"):
        assert not judge_answer(answer, "5") and not judge_answer(answer, "x^2 + y^2 = 1"), answer
    assert answers_match("x^2 + y^2 - 1 = 0", "x^2 + y^2 = 1")


def test_text_and_empty_sets_match_only_themselves():
    assert answers_match("\\varnothing", "\\emptyset") and answers_match("\\{\\}", "\\emptyset")
    for answer in (
        "\\{\\}",
        "\\emptyset",
        "",
        " ",
        "\\text{}",
        "\\mathbb{R}",
        "\\text{all real numbers}",
    ):
        assert not answers_match(answer, "5") and not answers_match(answer, "\\{1\\}"), answer
    assert answers_match("\\text{Yes}", "yes") and not answers_match("\\text{yes no}", "yes")


def test_near_integers_are_not_integers():
    """A relative tolerance of 1e-6 made 1000000000 equal to 1000000007."""
    for answer in ("1000000000", "1000000006.6", "1000000007.5", "10^9", "1e9"):
        assert not judge_answer(answer, "1000000007"), answer
    assert judge_answer("1000000007", "10^9+7") and judge_answer("1000000007.0000001", "1000000007")
    assert judge_answer("2.9999999", "3") and not judge_answer("2.99", "3")
    assert not judge_answer("10^{40}", "10^{40}+1")  # exact, not at 30 digits


def test_variables_cannot_hide_behind_sample_points():
    """An answer undefined where the reference is defined differs; one undefined everywhere never
    matches; floors and absolute values are evaluated, not trusted."""
    assert not judge_answer("x + 0^{x - 1.75}", "x")
    assert not judge_answer("0^{x - 10}", "1") and not judge_answer(
        "\\log(x - 10) - \\log(x - 10)", "1"
    )
    assert not judge_answer("x^{x^{x^{x^{x^{x}}}}}", "1") and not judge_answer(
        "e^{e^{e^{e^{x}}}}", "x"
    )
    assert judge_answer("\\frac{x^2 - 1}{x - 1}", "x + 1") and not judge_answer("y", "x")


# ---- honest answers still score ------------------------------------------------------------

HONEST = [
    ("\\frac{1}{2}", "0.5"),
    ("2^{10}", "1024"),
    ("2^{19999}", "2\\cdot 2^{19998}"),
    ("10^{6000}", "1000^{2000}"),
    ("\\frac{2^{100}}{2^{99}}", "2"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)"),
    ("\\log_2 8", "3"),
    ("2^{\\log_2 8}", "8"),
    ("e^{i\\pi}", "-1"),
    ("20!", "2432902008176640000"),
    ("\\binom{10}{5}", "252"),
    ("\\sqrt{10^{20}+1}-10^{10}", "\\frac{1}{\\sqrt{10^{20}+1}+10^{10}}"),
    ("\\ln(x^2)", "2\\ln x"),
    ("(x-1)(x+1)", "x^2-1"),
    ("\\frac{x^2 - 1}{x - 1}", "x + 1"),
    ("\\{1, 2\\}", "2, 1"),
    ("(0, 1]", "(0,1]"),
    ("x = 3", "3"),
    ("1000000007", "10^9+7"),
    ("\\infty", "\\infty"),
    ("\\sqrt{3}\\sqrt{5}\\sqrt{7}\\sqrt{11}", "\\sqrt{1155}"),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("3\\pi", "9.42477796076938"),
    ("\\tan(\\arctan(5))", "5"),
]


@pytest.mark.parametrize("a, b", HONEST)
def test_honest_equivalent_answers_still_score(a, b):
    assert timed(judge_answer, a, b) and timed(judge_answer, b, a)

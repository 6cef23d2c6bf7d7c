"""Reward integrity of the math env (issue 34), beside tests/env/test_integrity_math.py: bounded
work on crafted input. Nested functions cost linear time in the judge, megabyte texts are read in
linear time by the extractors (which keep their meaning on honest text), and a seeded fuzz of
hostile expressions gets a bool or a JudgeError from the judge, each within the wall clock."""

import random
import time

import pytest

from atgrpo.sdk.judge import JudgeError
from env_svc.envs.answer_extract import extract_answer, extract_code, stdout_answer
from env_svc.envs.answers import answers_match, judge_answer
from tests.env.math_judging import (
    MB,
    WALL_S,
    timed,
    warm,  # noqa: F401 - an autouse fixture
)

# ---- bounded work: no blow-up on crafted input --------------------------------------------

NESTED = {
    "logs": ("\\log(", "3", ")"),
    "logs of a big number": ("\\log(", "3^{12000}", ")"),
    "log_b": ("\\log_{", "2", "}(\\sqrt{2})"),
    "sin of log": ("\\sin(\\log(", "2", "))"),
    "sqrt of log": ("\\sqrt{\\log(", "3", ")}"),
    "tan": ("\\tan(", "(-1+i)^{\\sqrt{2}-1}", ")"),
    "floor": ("\\lfloor ", "\\sqrt{2}\\cdot 10^{70}", "\\rfloor"),
    "abs": ("abs(", "2^{100} + 3^{60}i", ")"),
    "exp": ("\\exp(-", "1", ")"),
    "powers": ("\\sqrt{2}^{", "2", "}"),
}


@pytest.mark.parametrize("kind", NESTED)
def test_nested_functions_cost_linear_time(kind):
    """sympy evaluates a function of a number numerically, again at every level, more precisely
    each time: nine nested logs took 3 s, twelve about as many hours."""
    open_, inner, close = NESTED[kind]
    for depth in (6, 12, 24):
        answer = open_ * depth + inner + close * depth
        if len(answer) <= 400:
            try:
                timed(judge_answer, answer, "\\sqrt{2}")
            except JudgeError as e:
                assert e.reason in ("too_large", "too_deep", "undefined")


BACKTRACKING = {
    "answer then spaces": "Final answer" + " " * MB + "x",
    "answer then tabs, repeated": ("answer" + "\t" * 1000) * (MB // 1006),
    "boxed then spaces": "\\boxed" + " " * MB,
    "unclosed boxes": "\\boxed{" * (MB // 7),
    "one huge box": "\\boxed{" + "1" * MB + "}",
    "nested boxes": "\\boxed{" * 50_000 + "1" + "}" * 50_000,
    "fence then spaces": "```" + " " * MB,
    "fence then tabs, repeated": "```python \t\t" * (MB // 12),
    "unclosed fences": "```\n" * (MB // 4),
    "think tags": "</think>" * (MB // 8) + "```python\nprint(1)\n```",
    "and/or spaces": "\\boxed{1" + " " * 1500 + "and}",
    "dollars": "$" * MB,
    "backslashes": "\\" * MB,
}


@pytest.mark.parametrize("kind", BACKTRACKING)
def test_megabyte_texts_are_read_in_linear_time(kind):
    text = BACKTRACKING[kind]
    t = time.monotonic()
    for got in (extract_answer(text), stdout_answer(text)):
        if got is not None:
            answers_match(got, "1")
    extract_code(text)
    assert time.monotonic() - t < 3 * WALL_S, f"{kind}: {time.monotonic() - t:.1f}s"


def test_extractors_keep_their_meaning_on_honest_text():
    assert extract_code("```python\nprint(1)\n```") == "print(1)\n"
    assert extract_code("``` python3 \nprint(2)\n```") == "print(2)\n"
    assert (
        extract_answer("The answer is:  $12$") == "12"
        and extract_answer("Final answer is 7.") is None
    )
    assert extract_answer("final answer is : 7") == "7"
    assert (
        stdout_answer("thinking\n\\boxed{3}\n") == "3" and stdout_answer("x\nAnswer: 4\n\n") == "4"
    )
    assert stdout_answer("1" * 5000) == "1" * 5000  # whole: the judge refuses it, not a cut


def test_random_hostile_expressions_never_raise_anything_else():
    """A seeded fuzz of towers, roots, functions and sets: every verdict is a bool or a JudgeError,
    each well within the wall clock."""
    rng = random.Random(34)
    atoms = [
        "2",
        "9",
        "0",
        "-1",
        "x",
        "\\pi",
        "e",
        "i",
        "\\infty",
        "1e99",
        "1e-99",
        "2^{19999}",
        "(2^{255}+1)",
        "\\sqrt{2}",
        "99999999999999999999",
        "300",
        "\\frac{1}{3}",
    ]
    forms = [
        "{a}^{{{b}}}",
        "({a})^{{{b}}}",
        "{a}+{b}",
        "({a})({b})",
        "\\frac{{{a}}}{{{b}}}",
        "\\sqrt{{{a}}}",
        "\\sqrt[{a}]{{{b}}}",
        "({a})!",
        "\\sin({a})",
        "e^{{{a}}}",
        "\\log_{{{a}}}({b})",
        "\\binom{{{a}}}{{{b}}}",
        "\\lfloor {a} \\rfloor",
        "abs({a})",
        "\\ln({a})",
        "\\arcsin({a})",
        "\\{{{a}, {b}\\}}",
        "({a}, {b}]",
        "x = {a}",
    ]

    def gen(depth):
        if depth <= 0 or rng.random() < 0.25:
            return rng.choice(atoms)
        return rng.choice(forms).format(a=gen(depth - 1), b=gen(depth - 1))

    for _ in range(300):
        answer = gen(rng.randrange(1, 8))
        try:
            assert isinstance(
                timed(judge_answer, answer, rng.choice(["1", "x^2+1", "\\sqrt{2}", "(0,1]"])), bool
            )
        except JudgeError as e:
            assert e.reason in ("too_large", "too_deep", "undefined", "judge_failed")

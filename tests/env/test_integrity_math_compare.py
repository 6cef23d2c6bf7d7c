"""Reward integrity of the math judge's comparisons (issue 57, item 6), beside
tests/env/test_integrity_math.py: answers that matched a number, a tolerance or sample points they
should not have, and a right answer paid every turn.

On the code before: `5\\text{ is not the answer}` scored as 5 (words beside a number dropped); 0
equalled a reference of 2^-20 and 2^-20 one of 0 (a tolerance absolute whenever either side was an
integer); an expression built to vanish at the eight fixed, public sample points, or one that
vanishes at every positive point (floor(x/4), abs(x) - x), equalled the reference; and under
`done_when: agree` a reasoner earned +1 and the team 1.0 every turn it kept a right answer while
the tool disagreed.
"""

import asyncio
import random
import string

import pytest

from env_svc.envs import answer_eval
from env_svc.envs.answers import answers_match, judge_answer
from env_svc.envs.math import MathEnv


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    "answer",
    [
        "5\\text{ is not the answer}",
        "\\text{not } 5",
        "\\text{5 is not the answer}",
        "\\operatorname{not}\\,5",
        "\\mathrm{never}\\ 5",
        "5 \\textbf{wrong}",
        "\\text{maybe} 5 \\text{cm}",
    ],
)
def test_words_beside_a_number_are_not_dropped(answer):
    assert not judge_answer(answer, "5")


def test_units_and_function_names_still_read():
    assert judge_answer("12\\text{ cm}", "12") and judge_answer("5\\text{ square units}", "5")
    assert judge_answer("\\text{5 cm}", "5") and judge_answer("5 \\text{ and } 7", "7, 5")
    assert judge_answer("\\operatorname{sin}(x)", "\\sin x")  # a function, not a word
    assert not judge_answer("\\operatorname{sin}(x)", "x")  # was: the word dropped, x left


def test_the_tolerance_is_relative_to_the_reference():
    assert not judge_answer("0", "2^{-20}") and not judge_answer("2^{-20}", "0")
    assert not judge_answer("0", "10^{-7}") and not judge_answer("0", "0.0000005")
    assert judge_answer("10^{-10}", "0")  # a reference of 0 takes abs_tol: a program's float noise
    assert judge_answer("0.33333333333", "\\frac{1}{3}") and not judge_answer("0.3333", "1/3")
    assert judge_answer("2^{-20} \\cdot 1.0000001", "2^{-20}")  # relative, at any scale
    assert not judge_answer("2^{-20} \\cdot 1.001", "2^{-20}")
    assert judge_answer("2.9999999", "3") and not judge_answer("1000000006.6", "1000000007")


def _old_points():
    """The eight points every comparison used before: fixed, and public in the source."""
    rng = random.Random(20240607)
    return [{c: 0.5 + 2.5 * rng.random() for c in string.ascii_letters} for _ in range(8)]


def test_an_expression_built_to_vanish_at_sample_points_is_not_equal():
    vanish = "".join(f"(x-{p['x']!r})" for p in _old_points())
    assert not judge_answer(f"x^2-1+{vanish}", "x^2-1")
    assert not judge_answer(f"x^2-1+{vanish}", "(x-1)(x+1)")
    # the points are drawn per reference, the same for one reference every time
    assert answer_eval.sample_values("x^2-1") == answer_eval.sample_values("x^2-1")
    assert answer_eval.sample_values("x^2-1") != answer_eval.sample_values("x^2+1")
    assert all(0.5 < v < 3 for v in answer_eval.sample_values("x^2-1"))
    assert judge_answer("(x-1)(x+1)", "x^2-1") and judge_answer("\\frac{x^2-1}{x-1}", "x+1")


@pytest.mark.parametrize(
    "answer", ["x^2-1+floor(x/4)", "x^2-1+ceil(x/4)-1", "x^2-1+abs(x)-x", "abs(x^2-1)"]
)
def test_piecewise_functions_vanishing_at_every_sample_point_are_not_equal(answer):
    assert not judge_answer(answer, "x^2-1")


def test_piecewise_functions_the_reference_uses_still_compare():
    assert judge_answer("floor(x) + 1", "1 + floor(x)") and judge_answer("abs(2x)", "2 abs(x)")
    assert judge_answer("floor(7/2)", "3")  # no variable: a number


def test_a_right_answer_kept_under_agree_is_paid_once():
    """A lone reasoner under `done_when: agree` never agrees with anyone: its episode runs to
    max_turns, and it used to earn +1 (and the team 1.0) on each of them."""
    env = MathEnv({"turn_order": ["reasoner"], "done_when": "agree", "max_turns": 4})
    env.reset("train-half-of-third", 0, "train")  # the answer is 1/6
    steps = [run(env.step("reasoner", "\\boxed{\\frac{1}{6}}")) for _ in range(4)]
    assert [s.local_reward for s in steps] == [1.0, 0.0, 0.0, 0.0]
    assert [s.team_reward for s in steps] == [1.0, 0.0, 0.0, 0.0]
    assert all(s.success and s.info["correct"] and not s.done for s in steps)
    # wrong, right, wrong, right: paid for the first right answer only
    env.reset("train-half-of-third", 0, "train")
    got = [run(env.step("reasoner", f"\\boxed{{{a}}}")) for a in ("1/5", "1/6", "1/5", "1/6")]
    assert [s.local_reward for s in got] == [0.0, 1.0, 0.0, 0.0]
    assert [s.team_reward for s in got] == [0.0, 1.0, 0.0, 0.0]


def test_a_tool_that_keeps_disagreeing_earns_the_team_nothing_more(sandbox):
    env = MathEnv({"done_when": "agree", "max_turns": 3})
    env.reset("train-half-of-third", 0, "train")
    env.sandbox = sandbox
    team, reasoner = [], []
    for _ in range(3):
        tool = run(env.step("tool", "```python\nprint('1/5')\n```"))
        r = run(env.step("reasoner", "\\boxed{1/6}"))
        team += [tool.team_reward, r.team_reward]
        reasoner.append(r.local_reward)
        assert not r.done and not r.info["agree"]
    assert team == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0] and reasoner == [1.0, 0.0, 0.0]
    assert answers_match("1/6", "\\frac{1}{6}")

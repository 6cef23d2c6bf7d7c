"""Reward integrity of the math env (issue 34): answers written against the judge, not the problem.

Each attack asserts that it earns no credit, and where the judge cannot judge the answer (too large,
too deep, undefined) that it says so (`judge_error` and `parse_error` in the info, counted by the
host) instead of raising out of step; all of it within a generous wall clock, so that an attack
that makes the judge work hard fails here rather than hanging a run. Honest equivalent answers
still score. What the judge guarantees is in env_svc/envs/answers.py's docstring.

On the code before this suite: `\\sqrt{2}^{\\sqrt{2}^{\\sqrt{2}^{99}}}` raised MemoryError,
`((\\sqrt{2}^{19999})^{19999})^{19999}` ran 24 s then raised MemoryError; `\\sqrt{2^{9999}+1}` took
6 s (sympy factors a root's radicand), nine nested logs 5 s and ten 37 s (sympy re-evaluates each
level); "answer" and 20,000 spaces took 4 s, quadratic, so a megabyte of them hours (a
backtracking regex); and 1000000000 scored as 1000000007 (a relative tolerance).
"""

import asyncio
import random
import time

import pytest

from atgrpo.sdk import metrics
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.judge import JudgeError
from atgrpo.sdk.registry import Registry
from env_svc.envs import BUILTIN
from env_svc.envs.answer_extract import extract_answer, extract_code, stdout_answer
from env_svc.envs.answers import answers_match, judge_answer
from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.math import MathEnv

WALL_S = 2.0  # per judge call: generous, so that only real blow-ups fail
MB = 1 << 20


def run(coro):
    return asyncio.run(coro)


def timed(fn, *args):
    t = time.monotonic()
    try:
        return fn(*args)
    finally:
        assert time.monotonic() - t < WALL_S, (
            f"{fn.__name__} took {time.monotonic() - t:.1f}s on {args[0][:80]!r}"
        )


def refused(answer, gold="1"):
    """The JudgeError judge_answer raises for `answer` (failing if it judges it instead)."""
    with pytest.raises(JudgeError) as e:
        timed(judge_answer, answer, gold)
    return e.value


@pytest.fixture(scope="module", autouse=True)
def warm():
    answers_match("\\frac{1}{2}", "0.5")  # sympy's and mpmath's imports are not an attack


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


# ---- the environment: a refusal is a format failure, never an exception --------------------


def make(sandbox=None, **options):
    env = MathEnv(options)
    env.reset("train-half-of-third", 0, "train")  # the answer is 1/6
    env.sandbox = sandbox
    return env


@pytest.mark.parametrize(
    "answer",
    [
        "\\boxed{9^{9^{9^{9}}}}",
        "\\boxed{" + "(" * 5_000 + "1" + ")" * 5_000 + "}",
        "\\boxed{0/0}",
        "\\boxed{" + "1" * 19_000 + "}",
        "\\boxed{\\sqrt{2^{19999}+1}}",
    ],
)
def test_reasoner_refused_answer_is_a_format_failure(answer):
    """Refused after a right answer: the latest answer counts, and a refused one is wrong."""
    env = make(done_when="agree")
    assert run(env.step("reasoner", "\\boxed{1/6}")).success
    t = time.monotonic()
    r = run(env.step("reasoner", f"Let me think.\n{answer}"))
    assert time.monotonic() - t < WALL_S
    assert (r.local_reward, r.team_reward, r.done, r.success) == (FAILURE_REWARD, 0.0, False, False)
    assert r.info["judge_error"] in ("too_large", "too_deep", "undefined") and r.info["parse_error"]
    assert r.info["correct"] is False and len(r.info["answer"]) < 300
    assert env.answer is None and not env.success


def test_reasoner_megabyte_answers():
    env = make()
    for text in (
        "\\boxed{" + "1" * MB + "}",
        "x" * MB,
        "\\boxed{" * (MB // 7),
        "answer" + " " * MB + ": 1/7",
    ):
        t = time.monotonic()
        r = run(env.step("reasoner", text))
        assert time.monotonic() - t < 3 * WALL_S
        assert r.local_reward in (FAILURE_REWARD, 0.0) and not r.success
        assert "parse_error" in r.info or r.info.get("correct") is False


def test_reasoner_hedge_earns_nothing():
    env = make()
    for answer in (
        "\\boxed{\\frac{1}{6}, \\frac{1}{5}}",
        "\\boxed{\\frac16 \\text{ or } \\frac15}",
        "\\boxed{\\pm\\frac{1}{6}}",
        "\\boxed{x = \\frac{1}{5} = \\frac{1}{6}}",
    ):
        r = run(env.step("reasoner", answer))
        assert r.local_reward <= 0.0 and not r.success and not r.done, answer


def test_tool_output_is_bounded(sandbox):
    programs = {
        "tower": "print('9**9**9**9')",
        "long": "print('1' * 5000)",
        "deep": "print('(' * 10000 + '1' + ')' * 10000)",
        "nan": "print(float('nan'))",
        "inf": "print('oo-oo')",
        "huge int": "print(10 ** 100)",
    }
    for name, body in programs.items():
        env = make(sandbox=sandbox)
        r = run(env.step("tool", f"```python\n{body}\n```"))
        assert r.local_reward in (FAILURE_REWARD, 0.0) and not r.info.get("correct"), name
        if r.local_reward == FAILURE_REWARD:
            assert (
                r.info["judge_error"] in ("too_large", "too_deep", "undefined")
                and r.info["parse_error"]
            ), name
            assert env.tool_answer is None
    env = make(sandbox=sandbox, done_when="agree")
    run(env.step("tool", "```python\nprint('9**9**9**9')\n```"))
    r = run(env.step("reasoner", "\\boxed{9**9**9**9}"))
    assert not r.done and r.local_reward == FAILURE_REWARD  # two refused answers never agree


def test_host_counts_judge_errors():
    def count(reason):
        return metrics.JUDGE_ERRORS.labels("math", reason)._value.get()

    async def go():
        envs = LocalEnvs(EnvHost(Registry(BUILTIN, discover=False)))
        ep, _ = await envs.reset(
            "math",
            "train-half-of-third",
            seed=0,
            split="train",
            options={"turn_order": ["reasoner"]},
        )
        before = count("too_large"), count("undefined")
        r = await envs.step(ep, "reasoner", "\\boxed{9^{9^{9^{9}}}}")
        assert r.info["judge_error"] == "too_large" and r.local_reward == FAILURE_REWARD
        r = await envs.step(ep, "reasoner", "\\boxed{0/0}")
        assert r.info["judge_error"] == "undefined"
        assert (count("too_large"), count("undefined")) == (before[0] + 1, before[1] + 1)
        await envs.close_episodes([ep])

    run(go())

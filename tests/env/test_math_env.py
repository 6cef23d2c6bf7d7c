"""The `math` environment: answers checked as mathematics (safely), the reasoner's and the tool
agent's rewards, done/success, and episodes through the env host with the bwrap sandbox."""

import asyncio
import builtins
import json
import sys
import time

import pytest

from atgrpo import errors
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from env_svc import datasets
from env_svc.envs import BUILTIN
from env_svc.envs.answer_extract import extract_answer
from env_svc.envs.answers import _Text, answers_match, parse_answer
from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.math import MathEnv


def run(coro):
    return asyncio.run(coro)


# ---- the checker -----------------------------------------------------------------------------

SAME = [
    ("1/2", "0.5"),
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac12", "1/2"),
    ("-\\frac{1}{2}", "-0.5"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)"),
    ("\\sqrt[3]{27}", "3"),
    ("(x-1)(x+1)", "x^2-1"),
    ("x^2 + 4x + 4", "(x+2)^2"),
    ("a+b", "b+a"),
    ("2x", "x*2"),
    ("3.0000001", "3"),
    ("\\pi", "3.14159265358979"),
    ("1e-3", "0.001"),
    ("1,000", "1000"),
    ("2^{10}", "1024"),
    ("2**10", "1024"),
    ("10!", "3628800"),
    ("\\binom{5}{2}", "10"),
    ("e^{i\\pi}", "-1"),
    ("2i", "2\\cdot i"),
    ("\\log_2 8", "3"),
    ("\\ln(e^2)", "2"),
    ("(0, 1]", "(0,1]"),
    ("[-3, 3]", "\\left[-3,3\\right]"),
    ("(-\\infty, -2) \\cup (2, \\infty)", "(2,\\infty)\\cup(-\\infty,-2)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("{1, 2}", "2, 1"),
    ("5 \\text{ and } 7", "7, 5"),
    ("\\{3\\}", "3"),
    ("(7, 3)", "\\left(7, 3\\right)"),
    ("x = 3", "3"),
    ("y=2x+1", "1+2x"),
    ("12\\text{ cm}", "12"),
    ("12 cm", "12"),
    ("120^\\circ", "120"),
    ("50\\%", "50"),
    ("\\boxed{42}", "42"),
    ("$\\frac{1}{6}$", "1/6"),
    ("Yes", "\\text{yes}"),
]
DIFFERENT = [
    ("1/3", "0.33"),
    ("3.14", "\\pi"),
    ("x^2+1", "x^2-1"),
    ("(0,1]", "[0,1]"),
    ("(0, 1)", "(0, 1]"),
    ("(1,2)", "(2,1)"),
    ("\\{1,2\\}", "\\{1,2,3\\}"),
    ("2", "-2"),
    ("\\sqrt{2}", "1.41"),
    ("x", "y"),
    ("no", "yes"),
    ("", "0"),
    ("1/0", "0"),
    ("\\infty", "-\\infty"),
]


@pytest.mark.parametrize("a, b", SAME)
def test_equal_answers_written_differently(a, b):
    assert answers_match(a, b) and answers_match(b, a)


@pytest.mark.parametrize("a, b", DIFFERENT)
def test_different_answers(a, b):
    assert not answers_match(a, b) and not answers_match(b, a)


def test_tolerance_is_an_option():
    assert not answers_match("3.14", "\\pi")
    assert answers_match("3.14", "\\pi", rel_tol=1e-3)


HOSTILE = [
    "__import__('os').system('touch /tmp/atgrpo-math-pwned')",
    "().__class__.__bases__[0].__subclasses__()",
    "lambda: 0",
    "exec('1')",
    "eval('2')",
    "open('/etc/passwd').read()",
    "x.__dict__",
    "9^{9^{9^9}}",
    "2^{10^{10}}",
    "(2^{10000})^{2}",
    "\\sqrt{2}^{1000000000}",
    "((3!)!)!",
    "\\binom{10^{6}}{5}",
    "1" * 500,
    "(" * 200 + "1" + ")" * 200,
    "x^{10^{50}} + " * 20 + "1",
    "\\frac{" * 60 + "1" + "}{2}" * 60,
    "\\input{/etc/passwd}",
    "\\def\\a{\\a}\\a",
]


@pytest.fixture(scope="module")
def warm():
    for a, b in SAME:  # every lazy import happens before any patch
        answers_match(a, b)


@pytest.mark.parametrize("answer", HOSTILE)
def test_hostile_answers_are_bounded_and_never_evaluated(answer, monkeypatch, warm):
    """No eval, sympify or parse_expr of model text: with each made to fail on a string, hostile
    (and ordinary) answers are still checked, in bounded time, with no side effect."""
    import sympy.parsing.sympy_parser as sympy_parser

    sympify_mod = sys.modules["sympy.core.sympify"]
    real_eval, real_sympify = builtins.eval, sympify_mod.sympify

    def no_strings(real):
        def guard(a=None, *args, **kwargs):
            if isinstance(a, str):
                raise AssertionError(f"model text reached an evaluator: {a!r}")
            return real(a, *args, **kwargs)

        return guard

    monkeypatch.setattr(builtins, "eval", no_strings(real_eval))
    monkeypatch.setattr(sympify_mod, "sympify", no_strings(real_sympify))
    monkeypatch.setattr(sympy_parser, "parse_expr", no_strings(sympy_parser.parse_expr))
    t = time.monotonic()
    assert not answers_match(answer, "1")
    assert time.monotonic() - t < 2.0
    for a, b in SAME[:12]:
        assert answers_match(a, b)  # the checker itself never needs them
    import os

    assert not os.path.exists("/tmp/atgrpo-math-pwned")


def test_answer_extraction():
    assert extract_answer("so \\boxed{\\frac{1}{2}} or rather \\boxed{\\{1, 2\\}}.") == "\\{1, 2\\}"
    assert extract_answer("\\boxed{x^{2}}") == "x^{2}"
    assert extract_answer("Thinking...\nFinal answer: 7.") == "7"
    assert extract_answer("The answer is: $12$") == "12"
    assert extract_answer("no answer here") is None
    assert extract_answer("\\boxed{}") is None
    assert extract_answer("\\boxed{unclosed") is None
    t = time.monotonic()
    assert extract_answer("\\boxed{" * 100_000) is None and not answers_match(
        "\\boxed{" * 100_000 + "1", "1"
    )
    assert time.monotonic() - t < 3.0  # many unclosed boxes: bounded work


def test_sample_answers_read_as_mathematics():
    for split in ("train", "eval"):
        problems = datasets.load("math", datasets.Source(), split)
        assert len(problems) >= 20 and len({p.id for p in problems}) == len(problems)
        for p in problems:
            assert not isinstance(parse_answer(p.answer), _Text), p
            assert answers_match(f"The answer is \\boxed{{{p.answer}}}", p.answer)


# ---- the environment ----------------------------------------------------------------------


def make(task="train-half-of-third", sandbox=None, **options):
    env = MathEnv(options)
    env.reset(task, 0, "train")
    env.sandbox = sandbox
    return env


def program(body):
    return f"I'll compute it.\n```python\n{body}\n```"


def test_reasoner_rewards():
    env = make()
    assert env.spec.turn_order == ("tool", "reasoner") and env.spec.max_turns == 4
    wrong = run(env.step("reasoner", "It is \\boxed{1/5}."))
    assert (wrong.team_reward, wrong.local_reward, wrong.done, wrong.success) == (
        0.0,
        0.0,
        False,
        False,
    )
    assert wrong.info == {"answer": "1/5", "correct": False}
    bad = run(env.step("reasoner", "One sixth."))
    assert bad.local_reward == FAILURE_REWARD and "\\boxed" in bad.info["parse_error"]
    right = run(env.step("reasoner", "Half of a third: 0.1666666667, i.e. \\boxed{0.1666666667}"))
    assert (right.team_reward, right.local_reward, right.done, right.success) == (
        1.0,
        1.0,
        True,
        True,
    )
    over = run(env.step("reasoner", "\\boxed{1/6}"))
    assert over.done and over.info == {"error": "the episode is over"}


def test_tool_agent_rewards(sandbox):
    env = make(sandbox=sandbox)
    right = run(
        env.step(
            "tool",
            program(
                "from fractions import Fraction\nprint('thinking')\nprint(Fraction(1, 2) * "
                "Fraction(1, 3))"
            ),
        )
    )
    assert right.local_reward == 1.0 and right.info["answer"] == "1/6" and right.info["correct"]
    assert right.team_reward == 0.0 and not right.done  # the reasoner answers for the team
    prompt = env.observe("reasoner")[0]["content"]
    assert "Fraction(1, 2)" in prompt and "The tool agent's answer: 1/6" in prompt
    wrong = run(make(sandbox=sandbox).step("tool", program("print(1/5)")))
    assert wrong.local_reward == 0.0 and wrong.info["answer"] == "0.2"
    silent = run(make(sandbox=sandbox).step("tool", program("x = 1")))
    assert silent.local_reward == 0.0 and silent.info["answer"] is None
    crash = run(make(sandbox=sandbox).step("tool", program("print(1 / 0)")))
    assert crash.local_reward == FAILURE_REWARD and "ZeroDivisionError" in crash.info["exec_error"]
    hang = make(sandbox=sandbox, tool_timeout_s=0.3)
    r = run(hang.step("tool", program("while True:\n    pass")))
    assert r.local_reward == FAILURE_REWARD and r.info["verdict"] == "timeout"
    assert "gave no answer" in hang.observe("reasoner")[0]["content"]
    none = run(make(sandbox=sandbox).step("tool", "The answer is 1/6."))
    assert none.local_reward == FAILURE_REWARD and "```python" in none.info["parse_error"]


def test_tool_agent_needs_a_sandbox():
    with pytest.raises(errors.FailedPrecondition, match="--sandbox"):
        run(make().step("tool", program("print(1)")))


def test_done_when_agree_is_scored_by_correctness(sandbox):
    env = make(sandbox=sandbox, done_when="agree")
    run(env.step("tool", program("print(0.2)")))
    both_wrong = run(env.step("reasoner", "\\boxed{\\frac{1}{5}}"))
    assert both_wrong.done and not both_wrong.success and both_wrong.info["agree"]
    assert both_wrong.local_reward == both_wrong.team_reward == 0.0
    env = make(sandbox=sandbox, done_when="agree")
    run(env.step("tool", program("print('1/6')")))
    r = run(env.step("reasoner", "\\boxed{1/5}"))
    assert not r.done and not r.info["agree"]
    assert "Turn 1: tool printed 1/6; reasoner answered 1/5" in env.observe("tool")[0]["content"]
    with pytest.raises(ValueError, match="done_when"):
        MathEnv({"done_when": "always"})


def test_single_reasoner_l0_and_fork():
    env = make(turn_order=["reasoner"])
    assert env.spec.agents == ("reasoner",)
    content = env.observe("reasoner")[0]["content"]
    assert "tool agent" not in content and "\\boxed" in content
    fork = env.fork()
    assert fork.problem is env.problem
    run(fork.step("reasoner", "\\boxed{1/6}"))
    assert fork.success and not env.success and env.history == [] and fork.history
    with pytest.raises(ValueError, match="unknown agent"):
        env.observe("tool")


def test_episode_through_the_host(sandbox):
    async def go():
        envs = LocalEnvs(EnvHost(Registry(BUILTIN, discover=False), sandbox=sandbox))
        ep, spec = await envs.reset("math", "eval-union", seed=0, split="eval")
        assert spec.agents == ("tool", "reasoner")
        branches = await envs.fork(ep, 2)
        tools = await asyncio.gather(
            envs.step(branches[0], "tool", program("print('(-oo, -2) U (2, oo)')")),
            envs.step(branches[1], "tool", program("print('x < -2 or x > 2')")),
        )
        assert [t.local_reward for t in tools] == [0.0, 0.0]  # neither reads as the interval union
        r = await envs.step(
            branches[0], "reasoner", "So x^2 > 4 means \\boxed{(-\\infty,-2)\\cup(2,+\\infty)}"
        )
        assert r.done and r.success and r.turn == 0 and r.local_reward == 1.0
        await envs.close_episodes([ep, *branches])
        # the seed picks the task when the id is not a problem id: eval seeds walk the file in order
        ep, _ = await envs.reset("math", "eval-0", seed=0 + 1_000_000_000, split="eval")
        messages, _ = await envs.observe(ep, "reasoner")
        first = datasets.load("math", datasets.Source(), "eval")[0]
        assert first.question in messages[0]["content"]
        await envs.close_episodes([ep])

    run(go())


def test_bad_dataset_options_are_invalid_arguments(tmp_path):
    async def go():
        host = EnvHost(Registry(BUILTIN, discover=False))
        with pytest.raises(errors.InvalidArgument, match="unknown math dataset"):
            await host.reset("math", "t", 0, "train", {"dataset": "gsm9k", "path": "x.jsonl"})
        with pytest.raises(errors.InvalidArgument, match=r"no such file.*problem"):
            await host.reset(
                "math", "t", 0, "train", {"dataset": "aime", "path": str(tmp_path / "aime.jsonl")}
            )

    run(go())


def test_sample_rows_are_json():
    for split in ("train", "eval"):
        for line in (datasets.DATA_DIR / f"math_{split}.jsonl").read_text().splitlines():
            assert set(json.loads(line)) == {"id", "question", "answer"}

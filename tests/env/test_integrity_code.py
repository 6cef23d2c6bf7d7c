"""Reward integrity of the `code` env: answers written to fool the judge, on both isolated sandbox
backends, each asserting no credit (or a bounded penalty) and no crash.

HumanEval (check() judged through the call proxy): forged pass lines and exits, atexit hooks,
objects equal to everything, patched builtins, shadowed helpers, reading the test from disk or a
caller's frame. Sample problems: printing the statement's examples (one followed by a full stop
too), programs wrong on an edge case the statement's definition mentions, junk on stdout; which
tests are examples, on every sample problem and in each dataset's statement style. Farming: a
correct program repeated, worse-then-better, a tester's copies of one trivial test, a right test
before any wrong program, the same tests rewritten, and tests that keep an episode open.
Oversized and deeply nested tester input.
"""

import asyncio

import pytest

from atgrpo.sdk import metrics
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from env_svc import datasets
from env_svc.envs import BUILTIN
from env_svc.envs.code import CodeEnv
from env_svc.envs.code_check import call_program
from env_svc.envs.code_examples import shown_examples
from tests.env.test_code_env import RIGHT, SUM, WRONG, answer_with_tests


@pytest.fixture(scope="module")
def sandbox(isolated_sandbox):
    """Every test here runs on bwrap and on docker (tests/env/conftest.py)."""
    return isolated_sandbox


def fenced(code):
    return f"```python\n{code}\n```"


async def coder_results(sandbox, answers, dataset="humaneval", **options):
    async def one(task, code):
        env = CodeEnv({"dataset": dataset, "turn_order": ["coder"], **options})
        env.reset(task, 0, "eval" if dataset == "humaneval" else "train")
        env.sandbox = sandbox
        return await env.step("coder", fenced(code))

    return await asyncio.gather(*(one(t, c) for t, c in answers))


# HumanEval/53 is add(x, y): its check asserts add(0, 1) == 1, ... and 100 random pairs.
ADD_HACKS = {
    "forged pass line, then exit": "import os\nos.write(1, b'ATGRPO CHECK PASSED\\n')\nos._exit(0)",
    "exit 0 inside the function": "def add(x, y):\n    import sys\n    sys.exit(0)",
    "os._exit inside the function": "def add(x, y):\n    import os\n    os._exit(0)",
    "atexit hook prints a pass": "import atexit, os\natexit.register(lambda: os.write(1, "
    "b'ok\\n'))\ndef add(x, y):\n    raise RuntimeError",
    "always-equal object": "class E:\n    def __eq__(self, o): return True\n    __ne__ = lambda s, "
    "o: False\n    __hash__ = object.__hash__\ndef add(x, y):\n    return E()",
    "int subclass equal to everything": "class I(int):\n    def __eq__(self, o): return True\n"
    "    __hash__ = int.__hash__\ndef add(x, y):\n    return I(0)",
    "patched compile strips the asserts": "import builtins\n_c = builtins.compile\n"
    "builtins.compile = lambda *a, **k: _c(*a[:3], optimize=2)\n"
    "def add(x, y):\n    return 0",
    "patched exec runs nothing": "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
    "def add(x, y):\n    return 0",
    "patched sys.exit and abs": "import sys, builtins\nsys.exit = lambda *a: None\n"
    "builtins.abs = lambda x: 0\nbuiltins.AssertionError = type('N', (Exception,), {})\n"
    "def add(x, y):\n    return 0",
    "reads the test from disk": (
        "def add(x, y):\n    import os, sys\n"
        "    paths = [sys.argv[0]] + [os.path.join(d, f) for d in ('.', '/tmp')\n"
        "                                       for f in os.listdir(d)]\n"
        "    for p in paths:\n        try:\n"
        "            if 'candi' + 'date(0, 1)' in open(p, errors='ignore').read():\n"
        "                return x + y\n        except Exception:\n            pass\n"
        "    return -1"
    ),
    "reads the caller's frames": (
        "import sys\ndef add(x, y):\n    f = sys._getframe(1)\n    while f:\n"
        "        if 'check' in f.f_globals or 'candidate' in f.f_locals:\n"
        "            return x + y\n        f = f.f_back\n    return -1"
    ),
    "a generator, not a value": "def add(x, y):\n    yield x + y",
    "returns a function": "def add(x, y):\n    return add",
    "10 million elements": "def add(x, y):\n    return list(range(10**7))",
    "nested 1,000 deep": "def add(x, y):\n    v = []\n    for _ in range(1000):\n        v = [v]\n "
    "   return v",
    "raises SystemExit from a helper thread": (
        "import threading, os\n"
        "threading.Thread(target=lambda: os._exit(0)).start()\n"
        "def add(x, y):\n    return 0"
    ),
}


def test_humaneval_hacks_get_no_credit(sandbox):
    results = asyncio.run(
        coder_results(sandbox, [("humaneval-53", code) for code in ADD_HACKS.values()])
    )
    paid = {
        name: (r.local_reward, r.info)
        for name, r in zip(ADD_HACKS, results, strict=True)
        if r.success or r.local_reward > 0 or r.team_reward > 0
    }
    assert not paid, paid
    # each is a failed program (no credit), never an exception out of step
    assert all(r.local_reward in (0.0, -1.0) for r in results)


def test_shadowing_the_prompt_s_helper_does_not_change_the_check(sandbox):
    """HumanEval/32's check measures find_zero with the prompt's poly; an answer that redefines poly
    to be zero everywhere and returns 0 must fail, and the honest bisection still passes."""
    hack = "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0"
    honest = (
        "def find_zero(xs):\n    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n"
        "        lo, hi = lo * 2, hi * 2\n    for _ in range(200):\n        mid = (lo + hi) / 2\n"
        "        if poly(xs, mid) * poly(xs, lo) > 0:\n            lo = mid\n        else:\n"
        "            hi = mid\n    return lo"
    )
    shadow, right = asyncio.run(
        coder_results(sandbox, [("humaneval-32", hack), ("humaneval-32", honest)])
    )
    assert not shadow.success and shadow.local_reward == 0.0
    assert right.success and right.local_reward == 1.0, right.info


def test_the_sandboxed_program_holds_no_test():
    """What runs in the sandbox is the prompt, the answer and the call harness: no check, no
    expected value, no verdict line."""
    env = CodeEnv({"dataset": "humaneval"})
    env.reset("humaneval-53", 0, "eval")
    program = call_program("def add(x, y):\n    return x + y\n", "add", 2.0)
    assert "def check" not in program and "assert" not in program and "PASSED" not in program
    assert env.problem.check and "candidate(" in env.problem.check


def test_printing_the_statement_s_example_earns_nothing(sandbox):
    """train-sum-two's statement shows `3 4` -> `7`: that case is run and required, not paid."""
    (r,) = asyncio.run(coder_results(sandbox, [(SUM, "print(7)")], dataset="sample"))
    assert r.local_reward == 0.0 and not r.success
    assert (r.info["hidden_passed"], r.info["hidden_total"], r.info["examples"]) == (1, 5, 1)


# A program's time limit for the tests below, whose verdicts must not depend on a loaded machine
# (a cold docker run of `print(a + b)` can take over the default 2 s).
SLACK = {"case_timeout_s": 10}


# ---- examples: every hidden test decides success, the statement's examples are not paid ---------

# (task, a program wrong on an edge case that the statement's definition mentions, its paid
# fraction). The old filter took a test whose input and output occurred anywhere in the statement
# for an example and dropped it (leap year kept only 2024 and 2023): each of these got 1.0 and
# success.
EDGE_CASES = [
    # the century rule: only the examples test it, and the failed one (1900) counts
    ("train-leap-year", "y = int(input())\nprint('YES' if y % 4 == 0 else 'NO')", 3 / 4),
    (
        "train-prime-check",  # 1 is not prime
        "n = int(input())\nprint('YES' if all(n % d for d in range(2, int(n**0.5) + 1)) else 'NO')",
        4 / 5,
    ),
    (
        "train-fibonacci",  # F(0) = 1
        "n = int(input())\na, b = 1, 1\nfor _ in range(n - 1):\n    a, b = b, a + b\nprint(a)",
        3 / 4,
    ),
    (
        "train-fibonacci",  # F(1) = 0
        "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\n"
        "print(a if n != 1 else 0)",
        3 / 4,
    ),
    (
        "train-factorial",  # 0! = 0
        "n = int(input())\nr = n\nfor i in range(2, n):\n    r *= i\nprint(r)",
        3 / 4,
    ),
    (
        "train-factorial",  # 1! = 0
        "import math\nn = int(input())\nprint(math.factorial(n) if n != 1 else 0)",
        3 / 4,
    ),
]


def test_programs_wrong_on_an_edge_case_neither_succeed_nor_get_full_credit(sandbox):
    for task, code, paid in EDGE_CASES:  # one at a time: the module's sandbox outlives each loop
        (r,) = asyncio.run(coder_results(sandbox, [(task, code)], dataset="sample", **SLACK))
        assert not r.success and not r.done, (task, r.info)
        assert r.local_reward == r.team_reward == pytest.approx(paid, abs=1e-6), (task, r.info)


def test_an_example_followed_by_a_full_stop_is_not_paid(sandbox):
    """count_vowels's statement ends `count_vowels("Hello") == 2.`: the old filter read `2.` as
    one word, missed the example and paid a program returning 2 for it (0.2)."""
    (r,) = asyncio.run(
        coder_results(
            sandbox,
            [("train-count-vowels", "def count_vowels(s):\n    return 2")],
            dataset="sample",
            **SLACK,
        )
    )
    assert r.local_reward == 0.0 and not r.success and r.info["examples"] == 1


def test_the_examples_are_the_pairs_the_statements_show_and_only_those():
    """Across the 50 sample problems the examples are exactly the pairs each statement shows (its
    `Example:` line, and binary's `0 prints 0`): the values a definition mentions (`0! = 1`,
    `F(1) = 1`, `divisible by 4`, `(0 for n = 0)`, `A` for 90) stay paid tests."""
    found = {
        p.id: [i for i, shown in enumerate(shown_examples(p.statement, p.tests)) if shown]
        for split in ("train", "eval")
        for p in datasets.load("code", datasets.Source(), split)
    }
    two = {"train-leap-year", "train-balanced-brackets", "train-power-of-two", "train-binary"}
    assert len(found) == 50
    assert found == {pid: [0, 1] if pid in two else [0] for pid in found}


STATEMENT_STYLES = {
    "codeforces": (
        "Print the sum of n numbers.\n\nInput\n\nThe first line holds n (1 ≤ n ≤ 100).\n\n"
        "Output\n\nPrint one integer.\n\nExamples\n\nInput\n\n3\n1 2 3\n\nOutput\n\n6\n\n"
        "Input\n\n1\n100\n\nOutput\n\n100\n\nNote\n\n1 + 2 + 3 = 6.",
        [("3\n1 2 3\n", "6\n"), ("1\n100\n", "100\n"), ("2\n1 1\n", "2\n"), ("1\n100\n", "101\n")],
        (True, True, False, False),
    ),
    "atcoder": (
        "Print A+B.\n\nSample Input 1\n\n1 2\n\nSample Output 1\n\n3\n\n"
        "Sample Input 2\n\n100 100\n\nSample Output 2\n\n200\n",
        [("1 2\n", "3\n"), ("100 100\n", "200\n"), ("1 100\n", "101\n")],
        (True, True, False),
    ),
    "leetcode, named arguments": (
        "Return the indices of the two numbers that add up to target.\n\nExample 1:\n\n"
        "Input: nums = [2,7,11,15], target = 9\nOutput: [0,1]\n\nConstraints: 2 <= n",
        [("[2,7,11,15]\n9\n", "[0,1]\n"), ("[3,3]\n6\n", "[0,1]\n")],
        (True, False),
    ),
    "doctest, Python literals": (
        "def f(x, flag):\n    '''\n    >>> f(2, True)\n    4.0\n    >>> f('a', None)\n    'aa'\n"
        "    '''",
        [("2\ntrue\n", "4\n"), ('"a"\nnull\n', '"aa"\n'), ("3\ntrue\n", "6\n")],
        (True, True, False),
    ),
    "inline connectors and punctuation": (
        "Read n and print n squared: 3 is 9, 4 -> 16 and f(5) returns 25; input `6` prints `36`.",
        [("3\n", "9\n"), ("4\n", "16\n"), ("5\n", "25\n"), ("6\n", "36\n"), ("7\n", "49\n")],
        (False, True, True, True, False),  # "is" in running text does not mark a pair
    ),
    "fenced blocks": (
        "Reverse the line.\n\nInput:\n```\nabc\n```\nOutput:\n```\ncba\n```",
        [("abc\n", "cba\n"), ("xy\n", "yx\n")],
        (True, False),
    ),
}


@pytest.mark.parametrize("style", STATEMENT_STYLES)
def test_examples_are_recognised_in_each_dataset_s_statement_style(style):
    statement, tests, expected = STATEMENT_STYLES[style]
    assert shown_examples(statement, tuple(tests)) == expected


def test_junk_on_stdout_fails_a_function_problem(sandbox):
    """The harness prints the canonical result; an answer that writes more on the real stdout (or
    returns an object that is not data) fails, and one that returns the right data passes."""
    junk = (
        "import os\ndef two_sum(nums, target):\n    os.write(1, b'[0,1]\\n')\n"
        "    return [i for i in range(len(nums)) for j in range(i + 1, len(nums)) if nums[i] + "
        "nums[j] == target][:1] + [j for i in range(len(nums)) for j in range(i + 1, len(nums)) if "
        "nums[i] + nums[j] == target][:1]"
    )
    eq = (
        "class E:\n    def __eq__(self, o): return True\ndef two_sum(nums, target):\n    return E()"
    )
    a, b = asyncio.run(
        coder_results(sandbox, [("train-two-sum", junk), ("train-two-sum", eq)], dataset="sample")
    )
    assert not a.success and not b.success and b.local_reward == 0.0


# ---- farming -------------------------------------------------------------------------------


def step(env, agent, text):
    return asyncio.run(env.step(agent, text))


def test_a_correct_program_is_paid_once(sandbox):
    env = CodeEnv({"done_when": "tests"})
    env.reset(SUM, 0, "train")
    env.sandbox = sandbox
    paid = [step(env, "coder", RIGHT).local_reward]
    for _ in range(3):  # the tester keeps the episode open...
        step(env, "tester", answer_with_tests([("1 2", "4")]))
        paid.append(step(env, "coder", RIGHT).local_reward)  # ...and the coder resubmits
    assert paid == [1.0, 0.0, 0.0, 0.0]


def test_worse_then_better_adds_up_to_the_last_program(sandbox):
    env = CodeEnv({"turn_order": ["coder"]})
    env.reset(SUM, 0, "train")
    env.sandbox = sandbox
    crash = "```python\nraise SystemExit(1)\n```"
    rewards = [step(env, "coder", a).local_reward for a in (WRONG, crash, WRONG, crash, RIGHT)]
    assert sum(rewards) == pytest.approx(1.0) and rewards[1] == pytest.approx(-0.2)


def test_copies_of_one_trivial_test_earn_little_and_never_end_the_episode(sandbox):
    env = CodeEnv({"done_when": "tests"})
    env.reset(SUM, 0, "train")
    env.sandbox = sandbox
    step(env, "coder", WRONG)  # a - b: right only when b == 0
    r = step(env, "tester", answer_with_tests([("0 0", "0")] * 8))
    assert r.local_reward == 0.0 and not r.done  # one distinct test, and it catches nothing
    r = step(env, "tester", answer_with_tests([("1 1", "2")] * 8))
    assert r.local_reward == pytest.approx(1 / 8) and not r.done


def test_a_trivially_right_test_before_any_wrong_program_earns_nothing(sandbox):
    """The reference paid validity, 1.0, for one right test written before the coder had a wrong
    program for it to catch (with the tester first, or after a coder step without a program)."""
    for order in (["tester", "coder"], ["coder", "tester"]):
        env = CodeEnv({"turn_order": order, **SLACK})
        env.reset(SUM, 0, "train")
        env.sandbox = sandbox
        if order[0] == "coder":
            step(env, "coder", "no program")  # the coder fails to answer: still no wrong program
        r = step(env, "tester", answer_with_tests([("1 1", "2")]))
        assert r.local_reward == 0.0 and r.info["agree"] == 1, r.info


def test_the_tester_is_paid_its_tests_discrimination_at_the_end_of_the_episode(sandbox):
    """Each tester step is paid what its score gained, so the episode's tester rewards add up to
    its last tests' discrimination against all the episode's wrong programs: rewriting the same
    tests earns nothing twice, and tests that miss a later wrong program give back its share."""
    env = CodeEnv(SLACK)
    env.reset(SUM, 0, "train")
    env.sandbox = sandbox
    catches_minus = [("0 5", "5")]  # a - b prints -5
    paid = []
    step(env, "coder", WRONG)  # a - b
    paid.append(step(env, "tester", answer_with_tests(catches_minus)).local_reward)
    paid.append(step(env, "tester", answer_with_tests(catches_minus)).local_reward)
    assert paid == [1.0, 0.0]  # the same tests again: paid once
    step(env, "coder", "```python\na, b = map(int, input().split())\nprint(abs(a + b))\n```")
    r = step(env, "tester", answer_with_tests(catches_minus))  # abs(0 + 5) passes it
    paid.append(r.local_reward)
    assert r.info["caught"] == 1 and r.info["score"] == 0.5
    r = step(env, "tester", answer_with_tests([*catches_minus, ("-1 -1", "-2")]))
    paid.append(r.local_reward)
    assert r.info["caught"] == 2 and r.info["score"] == 1.0
    assert paid == [1.0, 0.0, -0.5, 0.5] and sum(paid) == 1.0
    # eight copies of the catching test score 1/8: the sum falls to that
    r = step(env, "tester", answer_with_tests([("-1 -1", "-2")] * 8))
    assert r.info["score"] == pytest.approx(1 / 8)
    assert sum(paid) + r.local_reward == pytest.approx(1 / 8)


def test_oversized_and_deeply_nested_tester_input_is_a_malformed_test_not_a_crash(sandbox):
    async def go():
        host = EnvHost(Registry(BUILTIN, discover=False), sandbox=sandbox)
        envs = LocalEnvs(host)
        ep, _ = await envs.reset("code", "train-two-sum", seed=0, split="train")
        before = metrics.JUDGE_ERRORS.labels("code", "too_deep")._value.get()
        deep = "[" * 10_000 + "]" * 10_000
        r = await envs.step(
            ep, "tester", answer_with_tests([(f"{deep}\n1", "[0, 1]"), ("[1, 2]\n3", "[0, 1]")])
        )
        assert r.info["malformed"] == 1 and r.info["judge_error"] == "too_deep"
        assert r.info["agree"] == 1 and r.local_reward == 0.0  # no wrong program to catch yet
        assert metrics.JUDGE_ERRORS.labels("code", "too_deep")._value.get() == before + 1
        huge = "[" + ",".join(["1"] * 200_000) + "]"
        r = await envs.step(ep, "tester", answer_with_tests([(f"{huge}\n1", "[0, 1]")]))
        assert (
            r.info["malformed"] == 1
            and r.info["judge_error"] == "too_large"
            and r.local_reward == 0.0
        )

    asyncio.run(go())


@pytest.mark.parametrize(
    "text",
    [
        "test" + " " * 900_000 + "x",
        "```" + "`" * 900_000,
        "**Test Input:**\n" * 60_000,
        "</think>" * 120_000,
        "```python\n" * 90_000,
    ],
)
def test_crafted_text_parses_in_linear_time(text):
    """A regex that backtracks over a long run (`\\s*test` on 900,000 spaces took minutes) would
    stall the step; each of these takes milliseconds (2 s is the generous bound)."""
    import time

    from env_svc.envs.answer_extract import extract_code
    from env_svc.envs.code_program import parse_tests

    t = time.monotonic()
    parse_tests(text)
    extract_code(text)
    assert time.monotonic() - t < 2.0

"""The `code` environment: coder and unit tester, every program run in a real bwrap sandbox.

Rewards on hand-written programs (correct, wrong, crashing, hanging), testers whose tests are
right or wrong, when an episode is done and when it succeeded, function-call problems through the
harness, and episodes driven through the env host (what env_svc serves).
"""

import asyncio
import inspect
import json
import time

import pytest

from atgrpo import errors
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.inprocess import LocalEnvs
from atgrpo.sdk.registry import Registry
from env_svc import code_formats, datasets
from env_svc.envs import BUILTIN
from env_svc.envs.code import CodeEnv, extract_code
from env_svc.envs.code_program import function_program, parse_tests
from env_svc.envs.common import FAILURE_REWARD


def run(coro):
    return asyncio.run(coro)


SUM = "train-sum-two"  # stdin: print a + b
TWO_SUM = "train-two-sum"  # function: two_sum(nums, target)

RIGHT = (
    "I read both numbers.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."
)
WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"  # right only when b == 0
CRASH = "```python\nraise SystemExit(input() + undefined_name)\n```"
HANG = "```python\nwhile True:\n    pass\n```"


def make(task=SUM, sandbox=None, split="train", **options):
    env = CodeEnv(options)
    env.reset(task, 0, split)
    env.sandbox = sandbox
    return env


def answer_with_tests(pairs):
    return "Here are my tests.\n" + "\n".join(
        f"**Test Input:**\n```\n{i}\n```\n**Test Output:**\n```\n{o}\n```" for i, o in pairs
    )


# ---- parsing model output --------------------------------------------------------------------


def test_code_extraction_is_robust_to_junk():
    assert extract_code("```python\nprint(1)\n```") == "print(1)\n"
    assert (
        extract_code("first\n```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```")
        == "print(2)\n"
    )
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"  # unlabeled block
    # labeled wins
    assert extract_code("```python\nprint(4)\n```\n```text\noutput\n```") == "print(4)\n"
    assert (
        extract_code("<think>```python\nprint(0)\n```</think>\n```python\nprint(5)\n```")
        == "print(5)\n"
    )
    assert extract_code("```python\nprint(6)") == "print(6)"  # unterminated (cut off)
    assert extract_code("I cannot do this.") is None
    assert extract_code("```python\n\n```") is None


def test_test_parsing_is_robust_to_junk():
    text = (
        "<think>maybe **Test Input:** ```\n0\n``` **Test Output:** ```\n9\n```</think>\n"
        "**Test Input 1:**\n```\n1 2\n```\n**Test Output 1:**\n```text\n3\n```\n"
        "Test input: 5 5\nTest output: 10\n\n"
        "**Test Input:**\n```\n7 7\n```\n(no output given)\n"
        "**Test Input:**\n```\n-1 1\n```\n**Test Output:** ```0```"
    )
    assert parse_tests(text) == [("1 2\n", "3\n"), ("5 5\n", "10\n"), ("-1 1\n", "0\n")]
    assert parse_tests("no tests here") == []
    many = answer_with_tests([(str(i), str(i)) for i in range(20)])
    assert len(parse_tests(many)) == 8 and len(parse_tests(many, limit=3)) == 3


# ---- coder rewards ---------------------------------------------------------------------------


def test_correct_program_earns_full_reward_and_success(sandbox):
    env = make(sandbox=sandbox)
    r = run(env.step("coder", RIGHT))
    assert (r.team_reward, r.local_reward, r.success) == (1.0, 1.0, True), r
    # five tests, the statement's own example ("3 4" -> 7) run and required but not paid
    assert r.info["hidden_passed"] == r.info["hidden_total"] == 5 and r.info["verdicts"] == {
        "ok": 5
    }
    assert r.info["examples"] == 1
    assert r.done  # success ends the episode (done_when: success)


def test_wrong_program_earns_its_pass_fraction(sandbox):
    env = make(sandbox=sandbox)
    r = run(env.step("coder", WRONG))
    # a - b equals a + b only for the test "0 0"; it fails the statement's example "3 4" -> 7,
    # which counts because it failed it: 1 of the 4 other tests and that example
    assert r.local_reward == r.team_reward == pytest.approx(1 / 5) and not r.success
    assert r.info["hidden_passed"] == 1 and r.info["examples"] == 1


def test_crashing_program_earns_zero_and_says_why(sandbox):
    env = make(sandbox=sandbox)
    r = run(env.step("coder", CRASH))
    assert r.local_reward == 0.0 > FAILURE_REWARD and not r.success
    assert r.info["verdicts"] == {"runtime_error": 5} and "NameError" in r.info["error"]


def test_hanging_program_costs_one_time_limit(sandbox):
    env = make(sandbox=sandbox, case_timeout_s=0.4)
    t = time.monotonic()
    r = run(env.step("coder", HANG))
    assert time.monotonic() - t < 3.0  # one 0.4 s limit, not five
    assert (
        r.local_reward == 0.0
        and r.info["verdicts"] == {"timeout": 1, "not_run": 4}
        and r.info["not_run"] == 4
    )


def test_no_code_block_is_a_format_failure_and_keeps_the_program(sandbox):
    env = make(sandbox=sandbox)
    run(env.step("coder", WRONG))
    r = run(env.step("coder", "I would add the numbers."))
    assert r.local_reward == FAILURE_REWARD and "```python" in r.info["parse_error"]
    assert r.team_reward == 0.2 and "a - b" in env.code  # the previous program stays


def test_a_step_without_a_sandbox_is_refused_not_scored():
    env = make()
    with pytest.raises(errors.FailedPrecondition, match="--sandbox"):
        run(env.step("coder", RIGHT))


# ---- tester rewards, done and success -------------------------------------------------------


def test_tester_reward_is_right_tests_that_catch_the_wrong_programs(sandbox):
    env = make(sandbox=sandbox)
    # Right tests before any wrong program catch nothing yet: no pay (the reference's paid 1).
    right = run(env.step("tester", answer_with_tests([("1 2", "3"), ("10 -4", "6")])))
    assert right.local_reward == 0.0 and right.info == {
        "tests": 2,
        "agree": 2,
        "caught": 0,
        "score": 0.0,
    }
    assert not right.done and right.team_reward == 0.0  # no program yet
    run(env.step("coder", WRONG))  # a - b
    # half the tests agree with the reference, and "1 2" -> 3 catches a - b
    half = run(
        env.step(
            "tester", answer_with_tests([("1 2", "3"), ("2 2", "5"), ("0 0", "1"), ("4 4", "8")])
        )
    )
    assert half.local_reward == pytest.approx(0.5) and half.info["agree"] == 2
    assert half.info["caught"] == 1 and not half.done
    bad = run(env.step("tester", "Test: 1 2 gives 3"))
    assert bad.local_reward == FAILURE_REWARD and "**Test Input:**" in bad.info["parse_error"]


def test_done_when_the_program_passes_tests_that_are_right(sandbox):
    env = make(sandbox=sandbox, done_when="tests")
    assert not run(env.step("coder", RIGHT)).done  # the tester has not written tests yet
    r = run(env.step("tester", answer_with_tests([("1 2", "3"), ("-5 6", "1")])))
    # no wrong program in this episode for the tests to catch: the tester earns nothing
    assert (r.done, r.success, r.local_reward, r.team_reward) == (True, True, 0.0, 1.0)
    assert r.info["code_passed"] == 2
    again = run(env.step("coder", RIGHT))
    assert again.done and again.info == {"error": "the episode is over"}


def test_agreeing_on_wrong_tests_does_not_end_the_episode(sandbox):
    """The reference ended an episode when the coder's program passed the tester's tests, right
    or wrong; here the tests must also agree with the reference solution."""
    env = make(sandbox=sandbox, done_when="tests")
    run(env.step("coder", WRONG))  # prints a - b
    # tests written for a - b
    r = run(env.step("tester", answer_with_tests([("5 3", "2"), ("9 1", "8")])))
    assert r.info["code_passed"] == 2 and r.info["agree"] == 0
    assert not r.done and r.local_reward == 0.0 and r.team_reward == pytest.approx(0.2)
    prompt = env.observe("coder")[0]["content"]
    assert "passes 2 of the tester's 2 tests" in prompt
    # the coder fixes its program; the tester's wrong tests now fail it, still not done
    fixed = run(env.step("coder", RIGHT))
    assert fixed.success and not fixed.done and fixed.info["tests_passed"] == 0
    assert "-> failed, the program printed:\n8" in env.observe("coder")[0]["content"]


def test_tests_that_miss_the_bug_earn_nothing_and_do_not_end_the_episode(sandbox):
    """Right tests that the wrong program passes tell it apart from nothing: the reference ended
    the episode here (and paid the tester in full) with a wrong program."""
    for done_when in ("tests", "success"):
        env = make(sandbox=sandbox, done_when=done_when)
        run(env.step("coder", WRONG))
        # right tests, b = 0 only
        r = run(env.step("tester", answer_with_tests([("0 0", "0"), ("7 0", "7")])))
        assert not r.done and not r.success and r.team_reward == pytest.approx(0.2)
        assert r.local_reward == 0.0 and (r.info["agree"], r.info["caught"]) == (2, 0)
        # catches a - b
        r = run(env.step("tester", answer_with_tests([("0 0", "0"), ("7 2", "9")])))
        assert r.local_reward == 1.0 and r.info["caught"] == 1 and not r.done


def test_tester_sees_the_coders_program_and_the_coder_sees_failures(sandbox):
    env = make(sandbox=sandbox)
    run(env.step("coder", CRASH))
    tester_prompt = env.observe("tester")[0]["content"]
    assert "The coder's current program:" in tester_prompt and "undefined_name" in tester_prompt
    run(env.step("tester", answer_with_tests([("1 2", "3")])))
    coder_prompt = env.observe("coder")[0]["content"]
    assert "-> failed (runtime_error): NameError" in coder_prompt
    assert "Turn 2 of 5" in coder_prompt and "Turn 1: coder wrote a program" in coder_prompt


# ---- function-call problems -----------------------------------------------------------------

SOLUTION_CLASS = """```python
class Solution:
    def two_sum(self, nums: List[int], target: int) -> List[int]:
        print("debug output must not count")
        seen = {}
        for j, x in enumerate(nums):
            if target - x in seen:
                return (seen[target - x], j)      # a tuple is a list in JSON
            seen[x] = j
```"""


def test_function_problem_through_the_harness(sandbox):
    env = make(TWO_SUM, sandbox=sandbox)
    assert "Implement the function `two_sum`" in env.observe("coder")[0]["content"]
    r = run(env.step("coder", SOLUTION_CLASS))
    assert r.local_reward == 1.0 and r.success, r.info
    plain = make(TWO_SUM, sandbox=sandbox)
    r = run(plain.step("coder", "```python\ndef two_sum(nums, target):\n    return [0, 1]\n```"))
    assert 0 < r.local_reward < 1  # right for the cases whose answer is [0, 1]
    misnamed = make(TWO_SUM, sandbox=sandbox)
    r = run(misnamed.step("coder", "```python\ndef twoSum(nums, target):\n    return [0, 1]\n```"))
    assert r.local_reward == 0.0 and "defines no function two_sum" in r.info["error"]


def test_function_problem_tester_tests_are_json_arguments(sandbox):
    env = make(TWO_SUM, sandbox=sandbox, done_when="tests")
    run(env.step("coder", SOLUTION_CLASS))
    r = run(
        env.step(
            "tester",
            answer_with_tests(
                [
                    ("[1, 2, 3]\n5", "[1, 2]"),
                    ("[4, 4]\n8", "[0,1]"),
                    ("[1, 2]\n3", "(0, 1)"),
                    ("not json\n3", "[0, 1]"),
                ]
            ),
        )
    )
    assert (
        r.info["tests"] == 4
        and r.info["malformed"] == 1
        and "not a JSON value" in r.info["parse_error"]
    )
    assert r.info["agree"] == 3 and r.info["code_passed"] == 3
    assert r.local_reward == 0.0  # right tests, but no wrong program yet to catch
    assert not r.done  # a malformed test is not a right one
    assert "-> not run:" in env.observe("coder")[0]["content"]


def test_harness_prints_canonical_results():
    program = function_program("def f(x):\n    return x", "f")
    assert "def canonical(" in program and "def canonical_json(" in program
    assert inspect.getsource(code_formats.canonical) in program
    assert code_formats.canonical_json((1.0, 0.1 + 0.2, {2, 1})) == "[1,0.3,[1,2]]"


# ---- episodes through the env host ---------------------------------------------------------


def test_episode_with_forks_through_the_host(sandbox):
    """What env_svc serves: reset, fork K branches, step each, keep the best, until done."""

    async def go():
        envs = LocalEnvs(EnvHost(Registry(BUILTIN, discover=False), sandbox=sandbox))
        ep, spec = await envs.reset(
            "code", SUM, seed=0, split="train", options={"done_when": "tests"}
        )
        assert spec.turn_order == ("coder", "tester") and spec.max_turns == 5
        branches = await envs.fork(ep, 3)
        results = await asyncio.gather(
            *(
                envs.step(b, "coder", a)
                for b, a in zip(branches, (WRONG, RIGHT, CRASH), strict=True)
            )
        )
        assert [r.local_reward for r in results] == [pytest.approx(0.2), 1.0, 0.0]
        assert all(r.turn == 0 for r in results)
        best = branches[1]
        await envs.close_episodes([ep, branches[0], branches[2]])
        messages, turn = await envs.observe(best, "tester")
        assert turn == 0 and "print(a + b)" in messages[0]["content"]
        r = await envs.step(best, "tester", answer_with_tests([("2 3", "5")]))
        assert r.done and r.success and r.turn == 0
        with pytest.raises(errors.FailedPrecondition):
            await envs.step(best, "coder", RIGHT)
        await envs.close_episodes([best])

    run(go())


def test_single_coder_l0_is_done_on_success(sandbox):
    env = make(sandbox=sandbox, turn_order=["coder"])
    assert env.spec.agents == ("coder",) and env.done_when == "success"
    assert "unit tester" not in env.observe("coder")[0]["content"]
    r = run(env.step("coder", WRONG))
    assert not r.done
    assert run(env.step("coder", RIGHT)).done
    with pytest.raises(ValueError, match="turn_order"):
        CodeEnv({"turn_order": ["coder", "critic"]})
    with pytest.raises(ValueError, match="done_when"):
        CodeEnv({"done_when": "agree"})


def test_fork_is_independent(sandbox):
    env = make(sandbox=sandbox)
    run(env.step("coder", WRONG))
    fork = env.fork()
    assert fork.sandbox is sandbox and fork.problem is env.problem
    run(fork.step("coder", RIGHT))
    assert fork.paid == 1.0 and env.paid == pytest.approx(0.2)
    assert "a - b" in env.code and "a + b" in fork.code


def test_no_reference_solution_uses_a_program_that_passed(sandbox):
    """LiveCodeBench has no solutions: until a coder program passes every hidden test the
    tester's local reward is 0; then that program judges the tests."""
    env = make(sandbox=sandbox, done_when="tests")
    env.reference = ""  # as for a dataset without solutions
    r = run(env.step("tester", answer_with_tests([("1 2", "3"), ("1 1", "3")])))
    assert r.local_reward == 0.0 and r.info["no_reference"]
    r = run(env.step("coder", RIGHT))
    assert env.reference and env.valid == [True, False] and not r.done
    r = run(env.step("tester", answer_with_tests([("1 2", "3")])))
    assert r.info["agree"] == 1 and r.local_reward == 0.0 and r.done  # no wrong program to catch


CHECKER_HEAD = "\n".join(
    [
        "import contextlib, io, json, sys",
        inspect.getsource(code_formats.canonical),
        inspect.getsource(code_formats.canonical_json),
    ]
)


def test_sample_problems_reference_solutions_pass_their_tests(sandbox):
    """The shipped sample set: every reference solution passes its hidden tests (one sandbox
    program per split, running each solution in-process over its cases)."""
    checker = (
        CHECKER_HEAD
        + """
problems = json.loads(sys.stdin.read())
failed = []
for p in problems:
    for stdin, expected in p["tests"]:
        out = io.StringIO()
        try:
            if p["kind"] == "function":
                ns = {"__name__": "solution"}
                exec(p["solution"], ns)
                with contextlib.redirect_stdout(io.StringIO()):
                    got = canonical_json(ns[p["fn_name"]](*[json.loads(l) for l in stdin.splitlines()])) + "\\n"
            else:
                sys.stdin = io.StringIO(stdin)
                with contextlib.redirect_stdout(out):
                    exec(p["solution"], {"__name__": "__main__"})
                got = out.getvalue()
        except Exception as e:
            got = repr(e)
        if got.split() != expected.split():
            failed.append([p["id"], stdin, expected, got])
print(json.dumps(failed))
"""  # noqa: E501
    )

    async def go():
        from atgrpo.contract.sandbox import Limits

        for split in ("train", "eval"):
            problems = datasets.load("code", datasets.Source(), split)
            assert len(problems) >= 15 and len({p.id for p in problems}) == len(problems)
            assert {p.kind for p in problems} == {"stdin", "function"} and all(
                p.solution for p in problems
            )
            data = json.dumps(
                [
                    {
                        "id": p.id,
                        "kind": p.kind,
                        "fn_name": p.fn_name,
                        "solution": p.solution,
                        "tests": p.tests,
                    }
                    for p in problems
                ]
            )
            res = await sandbox.execute(
                "from __future__ import annotations\n" + checker,
                stdin=data.encode(),
                limits=Limits(30_000, 30_000, 1 << 30, 1 << 20, 16, 1 << 20, 64),
            )
            assert res.verdict.value == "ok", res.stderr.decode()[-500:]
            assert json.loads(res.stdout) == [], res.stdout.decode()[:1000]

    run(go())

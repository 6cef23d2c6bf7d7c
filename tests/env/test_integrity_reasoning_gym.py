"""Reward integrity of the `reasoning_gym` judge: answers written to break it, each asserting no
credit (or the dataset's own score for a wrong answer) and that nothing they contain ran.

reasoning-gym's own scorers eval() some answers (spiral_matrix, n_queens, ...), pass others to
sympy's parse_expr (countdown, puzzle24, the integration tasks), and pay wrong answers through
gaps (countdown's `0e0`, puzzle24's unchecked numbers, substring credit). The env scores those
datasets with our safe scorers (env_svc/envs/rg_safe.py) and every other dataset in the scorer
worker (env_svc/envs/rg_scorer.py): a child process per call, isolated. `rg_probe` registers a
dataset whose scorer evals the answer, standing in for a future scorer nobody audited. Constant
answers against every dataset: test_integrity_rg_constants.py.
"""

import asyncio
import ctypes
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest
import reasoning_gym as rg

from atgrpo.sdk.judge import JudgeError
from env_svc.envs import rg_scorer
from env_svc.envs.reasoning_gym import (
    ReasoningGymEnv,
    program_answer,
    reasoner_answer,
    tagged_answer,
)
from env_svc.envs.rg_safe import SAFE, SYMPY_SCORED, arithmetic, math_text, scorer_for
from tests.env import rg_probe

DEEP = "[" * 10_000 + "]" * 10_000
TOWER = "9**9**9**9"


def make(dataset, seed=0, config=None, **options):
    env = ReasoningGymEnv(
        {
            "turn_order": ["reasoner"],
            "dataset": dataset,
            "dataset_config": config or {},
            "train_size": 50,
            "max_turns": 10,
            **options,
        }
    )
    env.reset(f"train-{seed}", seed, "train")
    return env


def answer(env, text):
    """The reasoner's step on a fork of `env` (so one env serves many answers)."""
    return asyncio.run(env.fork().step("reasoner", f"<answer>{text}</answer>"))


@pytest.fixture
def marker():
    """A path under /tmp that an answer tries to create; the test asserts it never appears."""
    path = Path(f"/tmp/pwned_{uuid.uuid4().hex}")
    yield path
    assert not path.exists(), f"an answer created {path}"


def landlock_abi():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(libc.syscall(444, None, 0, 1), 0)


# ---- model text never runs as code -----------------------------------------------------------


@pytest.mark.parametrize(
    "dataset", ["n_queens", "spiral_matrix", "binary_matrix", "string_insertion"]
)
def test_eval_scorers_run_no_answer(dataset, marker):
    """These four datasets eval() an answer that is not the exact reference; ours read it as
    data."""
    env = make(dataset)
    for text in (
        f"__import__('os').system('touch {marker}')",
        f"open('{marker}', 'w')",
        f"[__import__('os').system('touch {marker}')]",
        f"[open('{marker}', 'w').close()]",
    ):
        r = answer(env, text)
        assert r.local_reward <= 0.0 and not marker.exists(), (text, r.info)
    assert answer(env, env.entry["answer"]).local_reward == 1.0


@pytest.mark.parametrize("dataset", sorted(SYMPY_SCORED))
def test_sympy_scorers_see_only_mathematics(dataset, marker):
    """parse_expr evals; the gate lets only numbers, one-letter symbols and math functions
    through."""
    env = make(dataset)
    for text in (
        f"__import__('os').system('touch {marker}')",
        "x.__class__",
        "(lambda: 1)()",
        "'x'",
        "x if 1 else x",
        "[x][0]",
        f"x + {TOWER}",
    ):
        r = answer(env, text)
        assert r.local_reward == -1.0 and r.info["judge_error"] in ("not_data", "too_large"), (
            text,
            r.info,
        )
    assert not marker.exists()


@pytest.mark.parametrize("dataset", ["simple_integration", "intermediate_integration"])
def test_the_unevaluated_integral_is_refused(dataset):
    """The integration scorers differentiate the answer: `Integral(f, x) + C` paid 1.0 on every
    question."""
    ds = rg.create_dataset(dataset, seed=0, size=50)
    entry = ds[0]
    meta = entry["metadata"]
    trick = f"Integral({meta['integrand']}, {meta['variable']}) + C"
    assert ds.score_answer(trick, entry) == 1.0  # the hole, in the dataset's own scorer
    env = make(dataset)
    meta = env.entry["metadata"]
    r = answer(env, f"Integral({meta['integrand']}, {meta['variable']}) + C")
    assert r.local_reward == -1.0 and r.info["judge_error"] == "not_data"


def test_an_answer_cannot_patch_the_scorer_for_later_answers():
    """An answer that rewrites the scorer (here from inside the scorer, via eval) changes nothing
    for the next answer: the child it ran in is gone. (Within its own call such an answer can set
    its own score, which is why the datasets whose scorers eval get safe scorers instead.)"""
    env = make(rg_probe.NAME)
    patches = [
        "setattr(__import__('tests.env.rg_probe', fromlist=['x']).ProbeDataset, 'score_answer', "
        "lambda *a: 1.0) or 0.0",
        "setattr(__import__('env_svc.envs.rg_scorer', fromlist=['x']), '_verdict', "
        "lambda d: {'score': 1.0}) or 0.0",
        "__import__('builtins').__setattr__('float', lambda x: 1.0) or 0.0",
        "setattr(__import__('reasoning_gym').dataset.ProceduralDataset, 'score_answer', lambda *a: "
        "1.0) or 0.0",
    ]
    for patch in patches:
        answer(env, patch)
        assert answer(env, "0").local_reward <= 0.0, patch  # scored fresh: 0, not 1
    assert answer(env, env.entry["answer"]).local_reward == 1.0
    # the safe path: n_queens never evaluates the patch at all
    queens = make("n_queens")
    assert (
        answer(
            queens,
            "setattr(__import__('reasoning_gym').games.n_queens.NQueensDataset, "
            "'score_answer', lambda *a: 1.0)",
        ).local_reward
        <= 0.0
    )
    assert answer(queens, "_ _ _ _").local_reward <= 0.0


def test_an_unaudited_scorer_runs_in_an_isolated_child(marker):
    """The probe's scorer evals the answer: it runs in a child of the worker, not in the env or the
    worker; as uid 65534 when the env is root; it cannot start a process, nor (where the kernel
    has Landlock) create a file or connect out."""
    env = make(rg_probe.NAME)
    me = os.getpid()
    assert answer(env, env.entry["answer"]).local_reward == 1.0  # starts the worker
    worker = rg_scorer.WORKER.proc.pid
    where = (
        f"1.0 if __import__('os').getpid() not in ({me}, {worker}) "
        f"and __import__('os').getppid() == {worker} else 0.0"
    )
    assert answer(env, where).local_reward == 1.0
    if os.getuid() == 0:
        assert (
            answer(
                env,
                "1.0 if __import__('os').getuid() == 65534 and not __import__('os').getgroups() "
                "else 0.0",
            ).local_reward
            == 1.0
        )
    r = answer(env, f"__import__('os').system('touch {marker}') and 0.0")
    assert r.local_reward <= 0.0 and not marker.exists()
    if landlock_abi() < 4:
        pytest.skip("no Landlock (ABI 4+) here: file writes and connects are not refused by it")
    r = answer(env, f"open('{marker}', 'w') and 0.0")
    assert (
        r.local_reward == -1.0 and r.info["judge_error"] == "scorer_error" and not marker.exists()
    )
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        r = answer(env, f"__import__('socket').create_connection(('127.0.0.1', {port}), 1) and 1.0")
        assert r.local_reward == -1.0 and r.info["judge_error"] == "scorer_error"
        with pytest.raises(BlockingIOError):
            server.accept()


def test_a_scorer_that_hangs_crashes_or_lies_is_a_judge_error(monkeypatch):
    monkeypatch.setattr(rg_scorer, "SCORE_TIMEOUT_S", 1.0)
    env = make(rg_probe.NAME)
    start = time.monotonic()
    r = answer(env, "__import__('time').sleep(30) or 1.0")
    assert (
        r.local_reward == -1.0
        and r.info["judge_error"] == "scorer_timeout"
        and time.monotonic() - start < 10
    )
    for text in (
        "__import__('os')._exit(0)",
        "__import__('os').kill(__import__('os').getpid(), 9)",
        "len(bytearray(2 ** 34))",
        "float('nan')",
        "2.0",
        "-1",
        "[].pop()",
        "__import__('sys').setrecursionlimit(10 ** 6) or (lambda f: f(f))(lambda f: f(f))",
    ):
        r = answer(env, text)
        assert r.local_reward == -1.0 and r.info["judge_error"] in (
            "scorer_error",
            "scorer_timeout",
        ), (text, r.info)
        assert (
            "error" in r.info["parse_error"]
            or "ran over" in r.info["parse_error"]
            or "failed" in r.info["parse_error"]
        )
    assert answer(env, env.entry["answer"]).local_reward == 1.0  # the worker itself is fine


def test_a_hung_or_dead_worker_does_not_hang_the_env(monkeypatch):
    monkeypatch.setattr(rg_scorer, "REQUEST_TIMEOUT_S", 1.0)
    ds = rg.create_dataset("mini_sudoku", seed=0, size=5)
    entry = ds[0]
    hung = rg_scorer.ScorerWorker([sys.executable, "-c", "import time; time.sleep(60)"])
    start = time.monotonic()
    with pytest.raises(JudgeError) as err:
        hung.score(ds, "mini_sudoku", "{}", entry["answer"], entry)
    assert (
        err.value.reason == "scorer_timeout" and time.monotonic() - start < 5 and hung.proc is None
    )
    dead = rg_scorer.ScorerWorker([sys.executable, "-c", "pass"])
    with pytest.raises(JudgeError) as err:
        dead.score(ds, "mini_sudoku", "{}", entry["answer"], entry)
    assert err.value.reason == "scorer_error"
    # the env's own worker, killed between answers, starts again on the next one
    monkeypatch.setattr(rg_scorer, "REQUEST_TIMEOUT_S", 60.0)
    env = make("mini_sudoku")
    assert answer(env, env.entry["answer"]).local_reward == 1.0
    rg_scorer.WORKER.proc.kill()
    rg_scorer.WORKER.proc.wait()
    assert answer(env, env.entry["answer"]).local_reward == 1.0


# ---- scorer gaps that paid wrong answers -----------------------------------------------------


def test_countdown_pays_only_the_puzzles_numbers():
    env = make("countdown")
    meta, ref = env.entry["metadata"], env.entry["answer"]
    nums, target = meta["numbers"], meta["target"]
    zeroed = f"({' + '.join(map(str, nums))})*0e0 + {target}e0"  # every number "used", none counted
    # the hole, in the dataset's own scorer
    assert env.dataset.score_answer(zeroed, env.entry) == 1.0
    r = answer(env, zeroed)
    assert r.local_reward == -1.0 and r.info["judge_error"] == "not_data"
    assert answer(env, ref).local_reward == 1.0
    assert env.dataset.score_answer(f"{target}", env.entry) == 0.05  # its format reward
    assert answer(env, f"{target}").local_reward == 0.0  # not the puzzle's numbers
    assert answer(env, f"{ref} + {nums[0]} - {nums[0]}").local_reward == 0.0  # a number used again
    assert answer(env, f"({ref}) * 1 * 1").local_reward == 0.0  # numbers of its own
    for form in (f"{nums[0]}.0", f"0{nums[0]}", f"{nums[0]}e0", f"{nums[0]}_0"):
        r = answer(env, ref.replace(str(nums[0]), form, 1))
        assert r.local_reward == -1.0 and r.info["judge_error"] == "not_data", form
    for text in (TOWER, DEEP, "2^3", "sqrt(4)", "x", "__import__('os')"):
        r = answer(env, text)
        assert r.local_reward == -1.0 and "judge_error" in r.info, text


def test_puzzle24_pays_only_the_puzzles_numbers_and_exactly_24():
    env = make("puzzle24")
    nums = env.entry["metadata"]["numbers"]
    others = next(
        t
        for t in ("4*6*1*1", "3*8*1*1", "2*3*4*1", "6*4*1*1")
        if sorted(map(int, t.split("*"))) != sorted(nums)
    )
    truncated = "7*7/2*1"  # 24.5, which int() made 24
    for trick in (others, truncated):
        # the holes, in the dataset's scorer
        assert env.dataset.score_answer(trick, env.entry) == 1.0
        assert answer(env, trick).local_reward == 0.0  # wrong: no format reward either
    assert answer(env, env.entry["answer"]).local_reward == 1.0
    r = answer(env, TOWER)
    assert r.local_reward == -1.0 and r.info["judge_error"] == "not_data"


@pytest.mark.parametrize(
    "dataset", ["leg_counting", "basic_arithmetic", "gcd", "chain_sum", "products"]
)
def test_no_credit_for_containing_the_answer(dataset):
    """reasoning-gym paid len(oracle)/len(answer) to any answer containing the right one."""
    env = make(dataset)
    ref = env.entry["answer"]
    for trick in (
        f"1{ref}",
        f"{ref}0",
        f"the answer is {ref}",
        " ".join(str(i) for i in range(200)),
    ):
        if trick != ref:
            assert answer(env, trick).local_reward <= 0.0, trick
    assert env.dataset.score_answer(f"1{ref}", env.entry) > 0  # the hole, in the dataset's scorer
    assert answer(env, ref).local_reward == 1.0


# ---- bounded: nothing an answer holds can fail the step --------------------------------------


@pytest.mark.parametrize(
    "dataset",
    [
        "n_queens",
        "basic_arithmetic",
        "mini_sudoku",
        "countdown",
        "polynomial_multiplication",
        rg_probe.NAME,
    ],
)
def test_oversized_and_deeply_nested_answers_are_format_failures(dataset):
    env = make(dataset)
    for text, reason in ((DEEP, "too_deep"), ("1" * 70_000, "too_large")):
        r = answer(env, text)
        assert r.local_reward == -1.0 and r.info["judge_error"] == reason, r.info
    r = answer(env, TOWER)
    assert r.local_reward <= 0.0
    if dataset in ("countdown", "polynomial_multiplication"):
        assert r.info["judge_error"] in ("not_data", "too_large")


def test_the_tool_agents_output_is_bounded_too(sandbox):
    env = ReasoningGymEnv({"dataset": "n_queens", "turn_order": ["tool"], "train_size": 5})
    env.sandbox = sandbox
    env.reset("train-0", 0, "train")
    r = asyncio.run(env.step("tool", "```python\nprint('[' * 10_000 + ']' * 10_000)\n```"))
    assert r.local_reward == -1.0 and r.info["judge_error"] == "too_deep"


def test_answer_extraction_is_linear_and_never_raises():
    start = time.monotonic()
    assert tagged_answer("<answer>" * 200_000) is None
    assert tagged_answer("<answer>1</answer>" + "<answer>" * 200_000) == "1"
    assert reasoner_answer("\\boxed{" * 50_000) is None
    assert program_answer("x\n" * 100_000 + "<answer>" * 50_000) == "<answer>" * 50_000
    assert time.monotonic() - start < 5
    assert tagged_answer("<answer> a </answer> <answer>b</answer>") == "b"
    assert tagged_answer("<answer>a</answer><answer> </answer>") is None


# ---- honest answers score as the datasets score them -----------------------------------------


def _variants(name, ref, entry):
    """Honest answers, right and wrong, in the forms each dataset accepts."""
    out = [ref, ref[::-1], ref[:-1], "foo", ""]
    if name == "n_queens":
        out += list(entry["metadata"]["valid_answers"])[:3] + [
            str([r.split() for r in ref.split("\n")])
        ]
    if name == "spiral_matrix":
        out += [str([int(x) for x in ref.split()]), str([int(x) for x in ref.split()][::-1])]
    if name == "binary_matrix":
        out += [str([[int(x) for x in r.split()] for r in ref.split("\n")]), str([[0]])]
    if name == "string_insertion":
        out += [str(list(ref)), str(list(ref[::-1]))]
    if name in ("countdown", "puzzle24"):
        out += [ref.replace("+", "-", 1), f"{ref} + 1", f"({ref})*1", f"-({ref})"]
    if name in ("chain_sum", "products"):
        out += [f"{ref}.00", str(int(ref) + 1), f"{int(ref):,}"]
    return out


@pytest.mark.parametrize("name", sorted(set(SAFE) - {"game_of_life_halting", "coin_flip"}))
def test_safe_scorers_score_honest_answers_as_the_dataset_does(name):
    """On each dataset's own reference answers and on honest wrong ones, ours give its score less
    its substring credit and format rewards; an answer ours refuses (JudgeError) is one the
    dataset paid its floor (0 or 0.01) at most. (game_of_life_halting and coin_flip paid wrong
    answers 1.0: tests/env/test_integrity_rg_constants.py.)"""
    count = 30 if name == "puzzle24" else 200  # puzzle24 generates with sympy: slow
    ds = rg.create_dataset(name, seed=11, size=count)
    for i in range(count):
        entry = ds[i]
        assert SAFE[name](ds, entry["answer"], entry) == 1.0, (i, entry["answer"])
        for text in _variants(name, entry["answer"], entry):
            theirs = ds.score_answer(text, entry)
            if name in ("chain_sum", "products", "countdown", "puzzle24") and theirs < 1.0:
                theirs = 0.0  # no substring credit (tested above) nor format reward
            try:
                ours = SAFE[name](ds, text, entry)
            except JudgeError:
                assert theirs in (0.0, 0.01), (i, text, theirs)
                continue
            assert ours == theirs, (i, text, ours, theirs)


def test_the_exact_scorer_covers_the_base_class_only():
    from reasoning_gym.factory import DATASETS

    for name in ("basic_arithmetic", "leg_counting", "maze", "gcd"):
        ds = rg.create_dataset(name, seed=2, size=20)
        assert scorer_for(name, ds) is not None
        for i in range(20):
            entry = ds[i]
            assert (
                scorer_for(name, ds)(ds, entry["answer"], entry)
                == ds.score_answer(entry["answer"], entry)
                == 1.0
            )
    for name in ("mini_sudoku", "sokoban", "word_ladder", "polynomial_multiplication"):
        assert scorer_for(name, DATASETS[name][0].__new__(DATASETS[name][0])) is None, name


@pytest.mark.parametrize("name", sorted(SYMPY_SCORED))
def test_the_gate_passes_honest_symbolic_answers_and_the_worker_scores_them(name):
    ds = rg.create_dataset(name, seed=5, size=60)
    refs = [ds[i]["answer"] for i in range(60)]
    honest = [a for a in refs if "Integral" not in a]
    assert len(honest) >= 45
    for a in honest:
        math_text(a)
    env = make(name, train_size=10)
    for seed in range(3):
        env = make(name, seed=seed)
        if "Integral" not in env.entry["answer"]:
            assert answer(env, env.entry["answer"]).local_reward == 1.0
            assert answer(env, "x + 1").local_reward <= 0.0


def test_arithmetic_is_exact_and_bounded():
    assert arithmetic("(3 + 4) * 5 - -2 / 4").value == pytest.approx(35.5)
    assert arithmetic("1/3 + 1/3 + 1/3").value == 1
    for text, reason in (
        ("(" * 40 + "1" + ")" * 40, "too_deep"),
        ("-" * 40 + "1", "too_deep"),
        ("1+" * 300 + "1", "too_large"),
        ("1/(2-2)", "not_data"),
        ("1 2", "not_data"),
        ("9" * 13, "not_data"),
        ("", "not_data"),
        ("(1", "not_data"),
    ):
        with pytest.raises(JudgeError) as err:
            arithmetic(text)
        assert err.value.reason == reason, text
    with pytest.raises(JudgeError):
        arithmetic("2*3", operators="+-")


def test_every_scorer_that_evaluates_text_is_ours_or_gated():
    """The audit, repeated on the installed reasoning-gym: a scorer that evals or parse_exprs the
    answer must have a safe scorer or the math-text gate (a new version's new one fails here)."""
    import inspect
    import re

    from reasoning_gym.factory import DATASETS

    evaluating = re.compile(r"\beval\(|\bexec\(|parse_expr|sympify|literal_eval")
    for name, (cls, _) in DATASETS.items():
        owner = next(c for c in cls.__mro__ if "score_answer" in c.__dict__)
        # evals its reference
        if evaluating.search(inspect.getsource(owner.score_answer)) and name != "number_sorting":
            assert name in SAFE or name in SYMPY_SCORED or name == rg_probe.NAME, name

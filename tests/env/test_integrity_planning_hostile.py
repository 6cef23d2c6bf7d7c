"""Reward integrity of the planning envs (issue 34), beside tests/env/test_integrity_planning.py:
nothing an agent writes crashes a step. Hostile plan answers, Sudoku cells and tool output (too
deep, too large, not data, bad moves, no code) are format failures with a reason, found in linear
time, and leave the puzzle and its ledgers untouched. Tool programs run in the real bwrap sandbox
(tests/env/conftest.py)."""

import json
import time
from types import SimpleNamespace

import pytest

from env_svc.envs.common import FAILURE_REWARD
from tests.env.planning_puzzles import fenced, honest_sum, path_env, room, run, sudoku_env
from tests.env.planning_solvers import PATH_SOLVER

# ---- nothing an agent writes crashes a step ---------------------------------------------------

DEEP = "[" * 10_000 + "]" * 10_000
HOSTILE = [
    ("#### " + DEEP, "too_deep"),
    ("#### " + "[" * 10_000, "too_deep"),  # never closed
    ("#### [" + "{" * 10_000 + "}" * 10_000 + "]", "too_deep"),
    ("#### [" + "(" * 10_000 + ")" * 10_000 + "]", "too_deep"),
    ("#### " + json.dumps(["U"] * 20_000), "too_large"),  # 100,000 characters
    ('#### ["U' + "x" * 200_000, "too_large"),  # a string never closed
    ("#### " + json.dumps(["U"] * 401), "bad_moves"),  # over 400 moves
    ("#### [" + "9" * 5_000 + "]", "not_data"),  # past Python's int digits
    ("#### " * 200_000, "no_list"),
    ("x" * 2_000_000, "no_marker"),
    ('#### ["U", "X"]', "bad_moves"),  # unknown moves ...
    ('#### ["up"]', "bad_moves"),
    ("#### [null, 1, 1e999999]", "bad_moves"),
    ('#### [["U"]]', "bad_moves"),
    ("#### [" + '"U",' * 100 + '"U\\u0000"]', "bad_moves"),
    ('#### {"U": 1}', "no_list"),
    ("#### [U, R]", "not_data"),
]
ENVS = {"plan_path": path_env, "sokoban": room, "sudoku": sudoku_env}


@pytest.mark.parametrize("name", ENVS)
@pytest.mark.parametrize(
    "text, reason", HOSTILE, ids=[f"{r}-{i}" for i, (_, r) in enumerate(HOSTILE)]
)
def test_hostile_plan_answers_are_format_failures(name, text, reason):
    env = ENVS[name]()
    before = json.dumps(env.puzzle_json())
    t = time.perf_counter()
    r = run(env.step("plan", text))
    assert time.perf_counter() - t < 2.0  # linear work, no recursion
    assert r.local_reward == FAILURE_REWARD and not r.done
    assert r.info["judge_error"] == reason, r.info
    assert len(r.info["parse_error"]) < 1000 and "####" in r.info["parse_error"]
    assert json.dumps(env.puzzle_json()) == before
    assert honest_sum(env) == honest_sum(ENVS[name]())  # the ledgers are untouched


@pytest.mark.parametrize(
    "text",
    [
        "#### [[0, 0, " + "9" * 4000 + "]]",
        "#### [[0, 0, 1.0]]",
        "#### [[0, 0, true]]",
        "#### [[-1, 0, 1]]",
        "#### [[0, 0, 5]]",
        "#### [[0, 0, 1, 2]]",
        "#### [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, " + "9" * 4000 + "]]",
    ],
)
def test_hostile_sudoku_cells_are_format_failures(text):
    env = sudoku_env()
    r = run(env.step("plan", text))
    assert r.local_reward == FAILURE_REWARD and r.info["judge_error"] == "bad_moves"
    assert len(r.info["parse_error"]) < 1000


@pytest.mark.parametrize(
    "output, reason",
    [
        (DEEP, "too_deep"),
        ("[" * 10_000, "too_deep"),
        (json.dumps(["U"] * 401), "bad_moves"),
        ('["U", "X"]', "bad_moves"),
        ("[" + "9" * 5_000 + "]", "not_data"),
    ],
)
def test_hostile_tool_output_is_a_format_failure(output, reason, sandbox):
    env = path_env()
    env.sandbox = sandbox
    program = fenced(f"import sys\nsys.stdout.write('**Actions List**: ' + {output!r})\n")
    r = run(env.step("tool", program))
    assert r.info["verdict"] == "ok", r.info
    assert r.local_reward == FAILURE_REWARD and r.info["judge_error"] == reason, r.info
    assert "actions list" in r.info["parse_error"]
    assert "proposed no actions" in env.observe("plan")[0]["content"]
    assert run(env.step("tool", fenced(PATH_SOLVER))).local_reward == pytest.approx(
        honest_sum(path_env())
    )


def test_a_sandbox_returning_a_megabyte_of_brackets_is_a_format_failure():
    """A sandbox whose output limit is larger than ours (or none): the parser still bounds it."""

    class Flood:
        async def execute(self, code, **kwargs):
            out = (
                b"**Actions List**: " + b"[" * 1_000_000 + b"\n**Actions List**: " + b"[" * 500_000
            )
            return SimpleNamespace(
                stdout=out, stderr=b"", verdict=SimpleNamespace(value="ok"), exit_code=0
            )

    env = path_env()
    env.sandbox = Flood()
    t = time.perf_counter()
    r = run(env.step("tool", fenced("print('hi')")))
    assert time.perf_counter() - t < 2.0
    assert r.local_reward == FAILURE_REWARD and r.info["judge_error"] == "too_deep"


def test_a_tool_answer_without_code_is_a_counted_format_failure():
    env = path_env()
    r = run(env.step("tool", "```python" * 100_000))
    assert r.local_reward == FAILURE_REWARD and r.info["judge_error"] == "no_code"

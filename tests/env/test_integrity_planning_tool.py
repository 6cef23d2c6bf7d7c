"""Reward integrity of the planning envs (issue 34), beside tests/env/test_integrity_planning.py:
the tool agent is paid for what a proposal adds. A winning proposal repeated while the plan agent
stalls is paid once, a path crept forward one step a turn at most one solve, and nothing is paid
for what play already reached. Tool programs run in the real bwrap sandbox
(tests/env/conftest.py)."""

import json

import pytest

from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.plan_ledger import episode_charge
from tests.env.planning_puzzles import (
    BACK,
    M,
    answer,
    fenced,
    honest_sum,
    path_env,
    room,
    run,
    sudoku_env,
)
from tests.env.planning_solvers import PATH_SOLVER, SOKOBAN_SOLVER, SUDOKU_SOLVER


def printing(moves):
    """A tool program that proposes `moves` whatever the puzzle."""
    return fenced(f"print('**Actions List**: ' + {json.dumps(json.dumps(moves))})")


# ---- the tool agent: paid for what a proposal adds --------------------------------------------

SOLVERS = {
    "plan_path": (path_env, PATH_SOLVER),
    "sokoban": (room, SOKOBAN_SOLVER),
    "sudoku": (sudoku_env, SUDOKU_SOLVER),
}


@pytest.mark.parametrize("name", SOLVERS)
def test_tool_repeating_a_winning_proposal_while_the_plan_stalls_is_paid_once(name, sandbox):
    make, solver = SOLVERS[name]
    env = make()
    env.sandbox = sandbox
    tool = []
    for turn in range(5):
        r = run(env.step("tool", fenced(solver)))
        assert r.info["would_solve"] and r.info["verdict"] == "ok", r.info
        if turn:
            assert r.info["gains"] == 0.0 and r.local_reward <= 0  # the same proposal: nothing new
        tool.append(r.local_reward)
        stall = run(env.step("plan", "#### let me think"))
        assert stall.local_reward == FAILURE_REWARD
    one_solve = tool[0]
    assert sum(tool) <= one_solve and sum(tool) > one_solve - M  # was 5 x one solve
    # The plan agent following the proposal is paid the full solve: play's record is its own.
    r = run(env.step("tool", fenced(solver)))
    p = run(env.step("plan", answer(r.info["actions"])))
    assert p.success and p.local_reward == pytest.approx(one_solve, abs=1e-6)


def test_tool_creeping_one_step_per_turn_is_paid_at_most_one_solve(sandbox):
    env = path_env(max_turns=12)
    env.sandbox = sandbox
    path = env.solution()
    tool = []
    for k in range(1, len(path) + 2):  # one step more each turn, then all again
        r = run(env.step("tool", printing(path[:k])))
        tool.append(r.local_reward)
        run(env.step("plan", "#### hmm"))  # the plan agent never moves
        assert r.info["gains"] == pytest.approx(
            1 if k < len(path) else 2.5 if k == len(path) else 0
        )
    assert sum(tool) == pytest.approx(
        9 + 1.5 - episode_charge(0.01 * (sum(range(1, 10)) + 9), M), abs=1e-5
    )
    assert sum(tool) < honest_sum(path_env())  # never more than a solve


def test_tool_is_not_paid_for_what_play_already_reached(sandbox):
    env = path_env()
    env.sandbox = sandbox
    path = env.solution()
    run(env.step("plan", answer(path[:5])))  # play gets 5 of 9 closer
    behind = run(env.step("tool", printing([BACK[path[4]]])))  # a step back: nothing
    assert behind.info["gains"] == 0.0 and behind.local_reward == pytest.approx(-0.01)
    rest = run(env.step("tool", printing(path[5:])))  # the rest: 4 steps and the goal
    assert rest.info["gains"] == pytest.approx(4 + 1 + 0.5) and rest.info["simulated"]["optimal"]
    again = run(env.step("tool", printing(path[5:])))  # the same again: nothing
    assert again.info["gains"] == 0.0

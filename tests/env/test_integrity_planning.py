"""Reward integrity of the planning envs (issue 34): an agent plays against the judge, not the
puzzle.

Each test plays one attack an optimiser would find (farming the shaping, repeating a proposal,
hostile text) and asserts what it earns: no credit beyond what the honest play earns, or a bounded
penalty, and that an honest optimal episode scores strictly more than every farming strategy
tried. The rules are in env_svc/envs/planning.py's docstring (gains paid once against the
episode's record; costs charged by the episode's ledger, below 0.9 in total; a format failure
scores -1 flat). This file holds the plan agent's farming of each puzzle and the episode's floor;
the tool agent's attacks are in test_integrity_planning_tool.py, hostile text in
test_integrity_planning_hostile.py, and the puzzles all three play in planning_puzzles.py.

Numbers the old rules gave (the adversarial tester's, and this file's attacks on the old code):
Sokoban on/off cycling 25.4 in one answer and 19.2 across turns against an honest 12.16;
Plan-Path walking away and back 37.5 against 10.4; the tool agent paid a full solve every turn.
"""

import pytest

from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.plan_ledger import episode_charge
from env_svc.envs.planning import MIN_ANSWER_REWARD
from env_svc.envs.sokoban import SokobanState, dead_squares
from tests.env.planning_puzzles import (
    AWAY,
    BACK,
    BACK_FROM_LEFT,
    BACK_FROM_RIGHT,
    CYCLE,
    FINISH,
    OFF_LEFT,
    OFF_RIGHT,
    ON,
    SOKOBAN_HONEST_GAINS,
    M,
    answer,
    honest_sum,
    path_env,
    plays,
    room,
    run,
    sudoku_env,
)


def totals(results):
    """(gains, costs, local rewards) summed over StepResults."""
    return (
        sum(r.info.get("gains", 0.0) for r in results),
        sum(r.info.get("costs", 0.0) for r in results),
        sum(r.local_reward for r in results),
    )


def test_the_puzzles_here_play_as_described():
    env = room()
    r = run(env.step("plan", answer(ON + FINISH)))
    assert r.success and r.local_reward == pytest.approx(SOKOBAN_HONEST_GAINS - 0.04)  # 12.16
    env = room()
    r = run(env.step("plan", answer(ON + CYCLE)))
    assert (
        r.info["boxes_on_goals"] == 1
        and env.state.boxes == ((2, 3), (4, 3))
        and env.state.player == (2, 2)
    )
    assert honest_sum(path_env()) == pytest.approx(9 * 0.99 + 1.5)  # 10.41
    assert honest_sum(sudoku_env()) == 3.0


# ---- Sokoban: a goal's first arrival pays once ----------------------------------------------


@pytest.mark.parametrize("rounds", [1, 5, 15])
def test_sokoban_goal_cycling_in_one_answer_earns_nothing_more(rounds):
    env = room()
    r = run(env.step("plan", answer(ON + CYCLE * rounds + FINISH)))
    assert r.success
    assert r.info["gains"] == pytest.approx(SOKOBAN_HONEST_GAINS)  # exactly an honest solve's gains
    # each push off 0.5
    assert r.info["costs"] == pytest.approx(2 * rounds * 0.5 + 0.01 * (4 + 12 * rounds))
    assert r.local_reward == pytest.approx(
        SOKOBAN_HONEST_GAINS - episode_charge(r.info["costs"], M), abs=1e-6
    )
    assert r.local_reward < honest_sum(room()) - 0.5  # was 25.4 against 12.16 (15 rounds)


def test_sokoban_goal_cycling_across_turns_earns_nothing_more():
    env = room()
    first = run(env.step("plan", answer(ON)))
    assert first.info["gains"] == pytest.approx(1.1)  # first arrival +1, D 2 -> 1
    results = [first]
    for off_moves, on_moves in [(OFF_RIGHT, BACK_FROM_RIGHT), (OFF_LEFT, BACK_FROM_LEFT)] * 3:
        off = run(env.step("plan", answer(off_moves)))  # off in one answer, on in the next
        on = run(env.step("plan", answer(on_moves)))
        assert off.info["gains"] == on.info["gains"] == 0.0  # the return pays nothing
        assert off.local_reward < 0 and on.local_reward < 0  # and both cost (off: 0.5)
        results += [off, on]
    results.append(run(env.step("plan", answer(FINISH))))
    assert env.success
    gains, costs, total = totals(results)
    assert gains == pytest.approx(SOKOBAN_HONEST_GAINS) and costs == pytest.approx(
        6 * 0.5 + 0.01 * (1 + 36 + 3)
    )
    assert total == pytest.approx(gains - episode_charge(costs, M), abs=1e-5)
    assert total < honest_sum(room()) - 0.8  # was 19.2 against 12.16


def test_sokoban_a_push_from_goal_to_goal_pays_the_new_goal_once():
    """Boxes starting on goals count as reached; a goal reached from another goal pays once."""
    env = room()
    env.goals = ((2, 3), (2, 4))
    env.state = SokobanState((2, 2), ((2, 3), (4, 3)))  # A on goal (2,3); B off
    env.dead = dead_squares(env.floor, frozenset(env.goals))
    env.record = env.tool_record = env.start_record()
    r = run(env.step("plan", answer(["R"])))  # A from goal (2,3) to goal (2,4)
    assert r.info["gains"] == 1.0 and r.info["costs"] == pytest.approx(0.01)
    # and back to (2,3): reached already
    back = run(env.step("plan", answer(["U", "R", "R", "D", "L"])))
    assert back.info["gains"] == 0.0 and back.local_reward == pytest.approx(-0.05)


# ---- Plan-Path: only a new best distance pays -------------------------------------------------


def test_plan_path_walking_away_and_back_across_turns_loses():
    env = path_env(max_turns=20)
    rewards = []
    for _ in range(9):
        away = run(env.step("plan", answer(AWAY)))
        back = run(env.step("plan", answer([BACK[m] for m in AWAY])))
        assert away.info["gains"] == back.info["gains"] == 0.0
        # its steps, nothing else
        assert away.info["costs"] == back.info["costs"] == pytest.approx(0.04)
        assert -0.04 - 1e-9 <= away.local_reward < 0 and -0.04 - 1e-9 <= back.local_reward < 0
        rewards += [away.local_reward, back.local_reward]
    rewards += plays(env, [answer(env.solution())])
    assert env.success
    # no optimal bonus
    assert sum(rewards) == pytest.approx(9 + 1 - episode_charge(18 * 0.04 + 0.09, M), abs=1e-5)
    assert sum(rewards) < honest_sum(path_env()) - 0.5  # was 37.5 against 10.4


def test_plan_path_walking_away_and_back_in_one_answer_loses():
    env = path_env()
    r = run(env.step("plan", answer(AWAY + [BACK[m] for m in AWAY] + env.solution())))
    assert r.success and not r.info["optimal"]
    assert r.info["gains"] == pytest.approx(9 + 1)  # the distance once, no optimal bonus
    assert r.local_reward == pytest.approx(10 - 0.17)
    assert r.local_reward < honest_sum(path_env())


def test_plan_path_bumping_walls_before_solving_loses():
    env = path_env()
    # row 0, then the edge
    r = run(env.step("plan", answer(["U"] * 3 + ["U"] * 20 + ["D"] * 3 + env.solution())))
    assert r.success and r.info["invalid_moves"] == 20 and r.info["gains"] == pytest.approx(10)
    assert r.local_reward < honest_sum(path_env()) - 1


# ---- Sudoku: a right digit pays once -----------------------------------------------------------


def test_sudoku_clearing_and_rewriting_loses():
    env = sudoku_env()
    cells = env.solution_moves()
    first, clear = cells[0], [cells[0][0], cells[0][1], 0]
    rewards = plays(env, [answer([first])])
    for _ in range(5):  # across turns
        rewards += plays(env, [answer([clear]), answer([first])])
    rewards += plays(env, [answer([first, clear] * 20 + cells)])  # and within one answer
    assert env.success
    assert sum(rewards) == pytest.approx(3 - episode_charge(25 / env.blanks, M), abs=1e-5)
    assert sum(rewards) < honest_sum(sudoku_env()) - 0.4


def test_sudoku_overwriting_right_digits_with_a_full_grid_loses():
    env = sudoku_env()
    solution = [list(row) for row in env.solution]
    wrong = [
        [v if env.givens[r][c] else 0 for c, v in enumerate(row)] for r, row in enumerate(solution)
    ]
    half = plays(env, [answer(env.solution_moves()[:3])])
    rewards = half + plays(env, [answer(wrong), answer(solution)])  # blank the grid, then solve it
    assert env.success
    # 3 digits undone
    assert sum(rewards) == pytest.approx(3 - episode_charge(3 / env.blanks, M), abs=1e-5)
    assert sum(rewards) < honest_sum(sudoku_env())


# ---- the episode's floor ------------------------------------------------------------------------


def _awful(name):
    """(env, an answer of 400 costly moves) for the floor test."""
    if name == "plan_path":
        return path_env(), ["U"] * 400  # 3 steps, then the grid's edge
    if name == "sokoban":
        return room(max_moves=10_000), ["L"] * 400  # into the wall (no move budget)
    env = sudoku_env()
    clue = next([r, c, v] for r, row in enumerate(env.givens) for c, v in enumerate(row) if v)
    return env, [clue] * 400  # writes on a given clue


@pytest.mark.parametrize("name", ["plan_path", "sokoban", "sudoku"])
def test_costs_are_floored_per_episode_and_failing_still_scores_lowest(name):
    env, awful = _awful(name)
    rewards = []
    for _ in range(8):
        group = [env.fork() for _ in range(3)]  # one GRPO group: one state
        answers = [answer(awful), "#### oops", answer(awful[:1])]
        bad, garbage, fine = (run(g.step("plan", a)) for g, a in zip(group, answers, strict=True))
        assert (
            garbage.local_reward
            == FAILURE_REWARD
            < MIN_ANSWER_REWARD
            <= bad.local_reward
            <= fine.local_reward
            <= 0
        )
        assert garbage.info["judge_error"] == "no_list" and bad.info["costs"] > 19
        rewards.append(run(env.step("plan", answer(awful))).local_reward)
    # The floor is the episode's: eight answers of 20-40 in costs are charged 0.9 in all (was 7.2).
    assert MIN_ANSWER_REWARD <= sum(rewards) <= rewards[0] < 0
    assert sum(rewards) == pytest.approx(-M, abs=1e-5)


def test_a_deadlock_is_charged_within_the_floor():
    env = room()
    r = run(env.step("plan", answer(["D", "R", "U"])))  # A pushed up into row 1: dead
    assert r.done and not r.success and r.info["failed"] and "dead square" in r.info["failure"]
    assert r.info["costs"] == pytest.approx(5.03)
    assert r.info["gains"] == 0.0 and r.local_reward == pytest.approx(
        -episode_charge(5.03, M), abs=1e-6
    )
    assert MIN_ANSWER_REWARD < r.local_reward < -0.89  # (was: exactly -0.9, per answer)


# ---- honest play wins -------------------------------------------------------------------------


def _farms():
    """(env maker, farming episodes as lists of plan answers)."""
    path = path_env().solution()
    cells = sudoku_env().solution_moves()
    clear = [cells[0][0], cells[0][1], 0]
    return {
        "sokoban": (
            room,
            [
                [ON + CYCLE * 15 + FINISH],
                [ON] + [OFF_RIGHT, BACK_FROM_RIGHT, OFF_LEFT, BACK_FROM_LEFT] * 4 + [FINISH],
                [ON + OFF_RIGHT, BACK_FROM_RIGHT + ["D", "L", "L", "D", "R"]],
                [["U", "D"] * 50 + ON + FINISH],
            ],
        ),
        "plan_path": (
            path_env,
            [
                [AWAY, [BACK[m] for m in AWAY]] * 9 + [path],
                [AWAY + [BACK[m] for m in AWAY] + path],
                [path[:4], [BACK[m] for m in reversed(path[:4])], path],
                [path[:-1], [BACK[path[-2]]], [path[-2], path[-1]]],
            ],
        ),
        "sudoku": (
            sudoku_env,
            [
                [[cells[0]], [clear], [cells[0]], [clear]] * 3 + [cells],
                [[cells[0], clear] * 50 + cells],
                [cells[:-1], [clear], cells],
            ],
        ),
    }


@pytest.mark.parametrize("name", ["sokoban", "plan_path", "sudoku"])
def test_an_honest_optimal_episode_beats_every_farming_strategy(name):
    make, farms = _farms()[name]
    honest = honest_sum(make())
    for i, moves in enumerate(farms):
        env = make()
        total = sum(plays(env, [answer(m) for m in moves]))
        assert env.success, i
        assert total < honest, (name, i, total, honest)

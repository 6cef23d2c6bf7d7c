"""The puzzles the planning envs' integrity suites (test_integrity_planning*.py) attack, and how
they play them: a hand-made Sokoban room whose box can be pushed on and off its goal, an open
Plan-Path grid, a Sudoku, answers in the agents' formats, and what an honest solve earns."""

import asyncio
import json

from env_svc.envs.plan_path import PlanPathEnv
from env_svc.envs.planning import MIN_ANSWER_REWARD
from env_svc.envs.sokoban import SokobanEnv, SokobanState, box_distance, dead_squares
from env_svc.envs.sudoku import SudokuEnv

BACK = {"U": "D", "D": "U", "L": "R", "R": "L"}
M = -MIN_ANSWER_REWARD  # the most an episode's costs are charged


def run(coro):
    return asyncio.run(coro)


def answer(moves):
    return f"I have a plan.\n#### {json.dumps(moves)}"


def fenced(script):
    return f"```python\n{script}\n```"


def plays(env, answers, agent="plan"):
    """Step `agent` through `answers`; the local rewards."""
    return [run(env.step(agent, a)).local_reward for a in answers]


# ---- puzzles ---------------------------------------------------------------------------------

# A 5x5 open room: box A starts beside its goal (one push R), box B likewise (one push R from
# (4,2)). A can be pushed on and off its goal, back and forth, without solving the room.
ROOM = ["#######", "#_____#", "#@$.__#", "#_____#", "#__$._#", "#_____#", "#######"]
ON, FINISH = ["R"], ["D", "D", "R"]  # honest: A onto its goal, then B onto its own
OFF_RIGHT = ["R"]  # A on (2,3) -> off to (2,4); player at (2,3)
BACK_FROM_RIGHT = ["U", "R", "R", "D", "L"]  # round to (2,5), push A back on
OFF_LEFT = ["L"]  # A on (2,3) -> off to (2,2); player at (2,3)
BACK_FROM_LEFT = ["U", "L", "L", "D", "R"]  # round to (2,1), push A back on
CYCLE = OFF_RIGHT + BACK_FROM_RIGHT + OFF_LEFT + BACK_FROM_LEFT  # two off-and-on rounds
SOKOBAN_HONEST_GAINS = 1 + 1 + 10 + 0.1 * 2  # two goals, the win, D from 2 to 0


def room(**options):
    env = SokobanEnv({"size": 7, "boxes": 2, **options})
    env.reset("room", 0, "train")  # then the hand-made room replaces the drawn one
    cells = {(r, c): ch for r, row in enumerate(ROOM) for c, ch in enumerate(row)}
    env.floor = frozenset(p for p, ch in cells.items() if ch != "#")
    env.goals = tuple(sorted(p for p, ch in cells.items() if ch == "."))
    boxes = tuple(sorted(p for p, ch in cells.items() if ch == "$"))
    env.dead = dead_squares(env.floor, frozenset(env.goals))
    env.d0 = box_distance(boxes, env.goals)
    env.state = SokobanState((2, 1), boxes)
    env.record = env.tool_record = env.start_record()
    return env


def path_env(**options):
    """An open 10x10 grid: start (3, 4), goal (8, 8), 9 moves; four moves L walk straight away."""
    env = PlanPathEnv({"grid_size": 10, "wall_ratio": 0.0, **options})
    env.reset("path", 4, "train")
    assert (env.state.pos, env.goal, env.optimum) == ((3, 4), (8, 8), 9)
    return env


AWAY = ["L"] * 4


def sudoku_env():
    env = SudokuEnv({})
    env.reset("sudoku", 9, "train")
    return env


def honest_sum(env):
    return sum(
        plays(env, [answer(env.solution_moves() if isinstance(env, SudokuEnv) else env.solution())])
    )

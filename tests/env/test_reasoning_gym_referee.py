"""reasoning-gym as an independent referee of our planning environments' judges.

reasoning-gym (another project's generators, solvers and scorers) makes puzzles with reference
answers. Each puzzle is converted into our environment's state, its reference answer into our
moves, and our judge (`parse_moves` + `simulate`, what a plan step applies) must accept it and
reject corrupted answers; where our solvers exist, reasoning-gym's `score_answer` must accept what
they produce. One test runs our sokoban env through the real env_svc over gRPC.

What is covered, and how exactly:

- **sudoku** (9x9, reasoning-gym `sudoku`) and **mini_sudoku** (4x4): exact. Our sizes are 4 and
  9 with 2x2 and 3x3 boxes, the same rules. The reference grid, as a full grid or as cell moves,
  solves; a changed blank digit, a changed clue and a valid grid with relabelled digits do not;
  our `count_solutions` agrees the puzzles are unique and our tests' independent backtracking
  solver produces grids reasoning-gym scores 1.0.
- **sokoban**: exact on the rules, with three differences in what is judged. reasoning-gym rooms
  are rectangles up to 20 wide with 1-10 boxes; our generator makes squares of 5-8 with 1-3
  boxes, but our judge takes any floor set, so rooms load as they are (`max_moves` raised to
  1000). Ours ends an answer at the first solved state and ignores later moves, reasoning-gym
  judges the state after all moves; ours fails an episode when a box is pushed onto a dead
  square, reasoning-gym plays on (such a box can never reach a goal, so both reject). Moves and
  pushes are the same (U/D/L/R, no pulls, a box stops at a wall or box). reasoning-gym makes a
  few rooms whose boxes all start on goals (with one box it may move none out of place); ours
  never does, and refuses an empty answer, so those are skipped (and counted).
- **maze**: partly. reasoning-gym's answer is the shortest path's length, not a path, with random
  wall/floor characters; we map them to `#`/`.` and check that our optimum (the +0.5 bonus's
  condition) equals its answer, that our optimal path is judged optimal and a detour is not, and
  that reasoning-gym accepts our path's length.
- **shortest_path** (reasoning-gym's path-as-moves grid task, our plan_path's twin): rectangles
  5-8 a side are padded to a square with walls (a wall and the grid's edge block alike). Ours
  lets a blocked move stand still (penalised, and it costs the optimal bonus), reasoning-gym
  rejects the path outright; so "reasoning-gym 1.0" is compared with "ours: solved, optimal, no
  invalid move", and "reasoning-gym 0.5" (valid but longer) with "solved, not optimal, no invalid
  move". Its infeasible grids (answer "infeasible") must be unreachable for our BFS too.
"""

import asyncio
import functools
import json
import re

import pytest
import reasoning_gym as rg  # make install brings it: the benchmarks extra

from env_svc.envs.plan_path import PathState, PlanPathEnv, bfs_distances, shortest_path
from env_svc.envs.sokoban import SokobanEnv, SokobanState, box_distance, dead_squares, solve_sokoban
from env_svc.envs.sudoku import SudokuEnv, SudokuState, count_solutions
from tests.env.planning_solvers import SOKOBAN_SOLVER, SUDOKU_SOLVER

SEED = 20250  # any; fixed so a failure names the same puzzle again
WORD = {"up": "U", "down": "D", "left": "L", "right": "R"}
BACK = {"U": "D", "D": "U", "L": "R", "R": "L"}


def entries(name, size, **config):
    return list(rg.create_dataset(name, seed=SEED, size=size, **config))


def load(script):
    namespace = {"__name__": "solver"}
    exec(script, namespace)
    return namespace


def judge(env, moves):
    """Our judge on a list of moves: what a plan step would apply (the state is not changed)."""
    return env.simulate(env.parse_moves(moves))


def solves(env, moves):
    """Does our judge accept `moves`? An answer it refuses to parse (e.g. an empty list) does
    not."""
    try:
        return judge(env, moves).solved
    except ValueError:
        return False


# ---- converters: a reasoning-gym puzzle as our env's state (the attributes generate() sets) ----


def sudoku_env(puzzle, solution):
    env = SudokuEnv({"size": len(puzzle)})
    env.givens = tuple(tuple(row) for row in puzzle)
    # only for progress shaping, not for "solved"
    env.solution = tuple(tuple(row) for row in solution)
    env.blanks = max(1, sum(v == 0 for row in puzzle for v in row))
    env.state = SudokuState([row[:] for row in puzzle])
    return env


def sokoban_env(gamestr):
    """reasoning-gym's legend: + wall, - floor, X goal, @ box, $ box on goal, * player, % player on
    goal."""
    rows = [line.split() for line in gamestr.strip().splitlines() if line.strip()]
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    env = SokobanEnv({"max_moves": 1000})
    env.floor = frozenset(p for p, ch in cells.items() if ch != "+")
    env.goals = tuple(sorted(p for p, ch in cells.items() if ch in "X$%"))
    boxes = tuple(sorted(p for p, ch in cells.items() if ch in "@$"))
    (player,) = [p for p, ch in cells.items() if ch in "*%"]
    env.dead = dead_squares(env.floor, frozenset(env.goals))
    env.d0 = max(1, box_distance(boxes, env.goals))
    env.state = SokobanState(player, boxes)
    return env


def path_env(rows, start, goal):
    """A square grid of '#' and '.' (rectangles padded with walls) with start and goal."""
    n = max(len(rows), max(len(r) for r in rows))
    grid = tuple(r.ljust(n, "#") for r in rows) + ("#" * n,) * (n - len(rows))
    env = PlanPathEnv({"grid_size": n})
    env.grid, env.start, env.goal = grid, start, goal
    env.dist = bfs_distances(grid, goal)
    env.optimum = env.dist.get(start, 0)
    env.state = PathState(pos=start)
    return env


def find(rows, ch):
    return next((r, c) for r, row in enumerate(rows) for c, x in enumerate(row) if x == ch)


def board_text(grid):
    return "\n".join(" ".join(map(str, row)) for row in grid)


# ---- sudoku ----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[("sudoku", 40), ("mini_sudoku", 200)], ids=lambda p: p[0])
def sudoku_family(request):
    name, count = request.param
    return rg.create_dataset(name, seed=SEED, size=count), entries(name, count)


def test_sudoku_reference_grids_solve_and_corruptions_do_not(sudoku_family):
    dataset, items = sudoku_family
    for i, e in enumerate(items):
        puzzle, solution = e["metadata"]["puzzle"], e["metadata"]["solution"]
        env = sudoku_env(puzzle, solution)
        n = len(puzzle)
        assert judge(env, solution).solved, i  # as a full grid
        cells = [[r, c, solution[r][c]] for r in range(n) for c in range(n) if not puzzle[r][c]]
        assert judge(env, cells).solved, i  # as cell moves
        r, c = next((r, c) for r in range(n) for c in range(n) if not puzzle[r][c])
        for bad, why in (
            (_changed(solution, r, c), "a blank changed"),
            (_changed(solution, *_clue(puzzle)), "a clue changed"),
            ([[v % n + 1 for v in row] for row in solution], "digits relabelled"),
        ):
            assert not judge(env, bad).solved, (i, why)
            assert dataset.score_answer(board_text(bad), e) < 1.0, (i, why)  # the referee agrees


def _changed(grid, r, c):
    n = len(grid)
    out = [row[:] for row in grid]
    out[r][c] = grid[r][c] % n + 1
    return out


def _clue(puzzle):
    return next((r, c) for r, row in enumerate(puzzle) for c, v in enumerate(row) if v)


def test_our_sudoku_solvers_satisfy_the_referee(sudoku_family):
    dataset, items = sudoku_family
    solutions = load(SUDOKU_SOLVER)["solutions"]
    for i, e in enumerate(items):
        puzzle = e["metadata"]["puzzle"]
        n = len(puzzle)
        assert count_solutions(puzzle) == 1, i  # both call it unique
        (grid,) = solutions([row[:] for row in puzzle], n, {4: 2, 9: 3}[n], 2)
        assert dataset.score_answer(board_text(grid), e) == 1.0, i


# ---- sokoban ---------------------------------------------------------------------------------

SOKOBAN_CONFIGS = {  # name -> (count, reasoning-gym config)
    "1-2 boxes, 5-7 wide": (
        150,
        dict(min_w=5, max_w=7, min_h=5, max_h=7, min_boxes=1, max_boxes=2),
    ),
    "2-3 boxes, 6-8 wide": (
        100,
        dict(min_w=6, max_w=8, min_h=6, max_h=8, min_boxes=2, max_boxes=3),
    ),
    "default (4-10 boxes)": (8, {}),
}


@functools.cache
def sokoban_family(label):
    count, config = SOKOBAN_CONFIGS[label]
    return rg.create_dataset("sokoban", seed=SEED, size=count, **config), entries(
        "sokoban", count, **config
    )


@pytest.mark.parametrize("label", SOKOBAN_CONFIGS)
def test_sokoban_reference_solutions_solve_and_corruptions_agree(label):
    dataset, items = sokoban_family(label)
    solved_already = 0
    for i, e in enumerate(items):
        env = sokoban_env(e["metadata"]["gamestr"])
        if set(env.state.boxes) <= set(env.goals):  # see the module docstring
            solved_already += 1
            continue
        moves = list(e["answer"])
        assert judge(env, moves).solved, i
        assert not solves(env, moves[:-1]) and dataset.score_answer(e["answer"][:-1], e) == 0.0, i
        for k in range(0, len(moves), max(1, len(moves) // 3)):  # a few one-move alterations
            for other in "UDLR".replace(moves[k], ""):
                bad = moves[:k] + [other] + moves[k + 1 :]
                _assert_sokoban_verdicts_agree(env, dataset, e, bad, (i, k, other))
    assert solved_already <= len(items) // 4, solved_already  # 20 of the 150 one-or-two-box rooms


def _assert_sokoban_verdicts_agree(env, dataset, entry, moves, where):
    ours = judge(env, moves)
    theirs = dataset.score_answer("".join(moves), entry) == 1.0
    if ours.solved and not theirs:
        # Ours stops at the first solved state; reasoning-gym judges the end. Solved at that prefix?
        used = ours.state.moves
        assert used < len(moves) and dataset.score_answer("".join(moves[:used]), entry) == 1.0, (
            where
        )
    else:
        assert ours.solved == theirs, where


@pytest.mark.parametrize("label", [k for k in SOKOBAN_CONFIGS if not k.startswith("default")])
def test_our_sokoban_solver_satisfies_the_referee(label):
    """Not on the default rooms: BFS over 4-10 boxes is too slow for a unit test."""
    dataset, items = sokoban_family(label)
    for i, e in enumerate(items):
        env = sokoban_env(e["metadata"]["gamestr"])
        ours = solve_sokoban(env.floor, frozenset(env.goals), env.state.boxes, env.state.player)
        assert ours is not None and dataset.score_answer("".join(ours), e) == 1.0, i
        assert len(ours) <= len(e["answer"]), i  # BFS is move-optimal


# ---- maze and shortest_path (plan_path) ------------------------------------------------------


def test_maze_optimum_matches_the_reference_length():
    dataset = rg.create_dataset("maze", seed=SEED, size=200)
    for i, e in enumerate(dataset):
        m = e["metadata"]
        rows = ["".join("#" if ch == m["wall"] else "." for ch in row) for row in m["grid"]]
        env = path_env(rows, find(m["grid"], m["start"]), find(m["grid"], m["goal"]))
        assert env.optimum == int(e["answer"]), i
        path = shortest_path(env.grid, env.start, env.goal)
        best = judge(env, path)
        assert (
            best.solved and best.info["optimal"] and dataset.score_answer(str(len(path)), e) == 1.0
        ), i
        assert not solves(env, path[:-1]), i
        detour = _detour(env, path)
        longer = judge(env, detour)
        assert longer.solved and not longer.info["optimal"], i
        assert dataset.score_answer(str(len(detour)), e) == 0.0, i


def _detour(env, path):
    """`path` with a step into a free neighbour of the start (not the goal) and back first."""
    r, c = env.start
    for m, (dr, dc) in {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}.items():
        nxt = (r + dr, c + dc)
        if env._free(*nxt) and nxt != env.goal:
            return [m, BACK[m], *path]
    raise AssertionError("the start has no free neighbour but the goal")


def test_shortest_path_reference_paths_and_corruptions_agree():
    dataset = rg.create_dataset("shortest_path", seed=SEED, size=300)
    feasible = infeasible = 0
    for i, e in enumerate(dataset):
        matrix = e["metadata"]["matrix"]
        rows = ["".join("#" if ch == "X" else "." for ch in row) for row in matrix]
        env = path_env(rows, find(matrix, "*"), find(matrix, "#"))
        if e["answer"] == "infeasible":
            infeasible += 1
            assert shortest_path(env.grid, env.start, env.goal) is None, i
            continue
        feasible += 1
        moves = [WORD[w] for w in e["answer"].split()]
        assert _verdict(env, moves) == 1.0, i
        assert (
            not solves(env, moves[:-1])
            and dataset.score_answer(" ".join(e["answer"].split()[:-1]), e) == 0.0
        ), i
        for k in range(len(moves)):
            for other in "UDLR".replace(moves[k], ""):
                bad = moves[:k] + [other] + moves[k + 1 :]
                words = " ".join(w for m in bad for w, x in WORD.items() if x == m)
                assert _verdict(env, bad) == dataset.score_answer(words, e), (i, k, other)
        ours = shortest_path(env.grid, env.start, env.goal)
        words = " ".join(next(w for w, x in WORD.items() if x == m) for m in ours)
        assert dataset.score_answer(words, e) == 1.0, i
    assert feasible > 100 and infeasible > 10, (feasible, infeasible)


def _verdict(env, moves):
    """Our judgement on reasoning-gym's scale: 1.0 optimal, 0.5 valid but longer, else 0."""
    out = judge(env, moves)
    if not out.solved or out.info["invalid_moves"]:
        return 0.0
    return 1.0 if out.info["optimal"] else 0.5


# ---- through the real env_svc ----------------------------------------------------------------

RG_LEGEND = {"#": "+", "_": "-", ".": "X", "$": "@", "*": "$", "@": "*", "+": "%"}


@pytest.fixture(scope="module")
def env_address(tmp_path_factory):
    from atgrpo.cli import launcher

    state = tmp_path_factory.mktemp("services")
    services = launcher.up(state, (launcher.ServiceProcess("env", "env"),), timeout_s=60)
    yield next(s.address for s in services if s.name == "env")
    launcher.down(state)


def test_sokoban_rooms_served_by_env_svc_are_judged_alike(env_address):
    """Our server's rooms, read from the plan agent's prompt: our tests' solver's moves win over
    gRPC and satisfy reasoning-gym's scorer; without the last move both say no."""
    from atgrpo.sdk.client import EnvClient

    dataset = rg.create_dataset("sokoban", seed=SEED, size=1)
    solve = load(SOKOBAN_SOLVER)["solve"]

    async def go():
        async with EnvClient(env_address) as c:
            for seed in range(5):
                ep, _ = await c.reset(
                    "sokoban", f"t{seed}", seed=seed, split="eval", options={"turn_order": ["plan"]}
                )
                prompt, _ = await c.observe(ep, "plan")
                puzzle = _room(prompt[-1]["content"])
                moves = solve(puzzle)
                entry = {
                    "metadata": {
                        "gamestr": "\n".join(
                            " ".join(RG_LEGEND[ch] for ch in row) for row in puzzle["grid"]
                        )
                    }
                }
                (short,) = await c.fork(ep, 1)
                lost = await c.step(short, "plan", f"#### {json.dumps(moves[:-1])}")
                won = await c.step(ep, "plan", f"#### {json.dumps(moves)}")
                assert won.success and dataset.score_answer("".join(moves), entry) == 1.0, seed
                assert (
                    not lost.success and dataset.score_answer("".join(moves[:-1]), entry) == 0.0
                ), seed
                await c.close_episodes([ep, short])

    asyncio.run(go())


def _room(prompt):
    """The room in the sokoban prompt (see SokobanEnv.render) as its puzzle JSON."""
    lines = prompt.split("row 0 is the top):\n", 1)[1].splitlines()
    rows = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("You are at"))]
    pos = re.search(r"You are at (\[.*?\]); boxes (\[.*?\]\]); goals (\[.*?\]\])", prompt)
    player, boxes, goals = (json.loads(g) for g in pos.groups())
    return {"grid": rows, "player": player, "boxes": boxes, "goals": goals}

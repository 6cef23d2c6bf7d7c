"""The three planning environments (Plan-Path, Sokoban, Sudoku) with their tool/plan workflow.

The tool agent's programs run in a real bwrap sandbox (one LocalSandbox for the module). The
"model outputs" below are solvers written here, independent of the environments' own solvers.
"""

import asyncio
import json

import pytest

from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.plan_answers import moves_text, parse_list_after
from env_svc.envs.plan_ledger import episode_charge
from env_svc.envs.plan_path import PlanPathEnv
from env_svc.envs.planning import MIN_ANSWER_REWARD
from env_svc.envs.sokoban import SokobanEnv
from env_svc.envs.sudoku import SudokuEnv, count_solutions
from tests.env.planning_solvers import PATH_SOLVER, SOKOBAN_SOLVER, SUDOKU_SOLVER


def load(script):
    namespace = {"__name__": "solver"}
    exec(script, namespace)
    return namespace


def fenced(script):
    return f"I will solve it with a search.\n```python\n{script}```\nThat prints the moves."


def run(coro):
    return asyncio.run(coro)


# ---- per-env adapters ------------------------------------------------------------------------

ENVS = {"plan_path": PlanPathEnv, "sokoban": SokobanEnv, "sudoku": SudokuEnv}
SOLVERS = {"plan_path": PATH_SOLVER, "sokoban": SOKOBAN_SOLVER, "sudoku": SUDOKU_SOLVER}


def make(name, seed=0, split="train", sandbox=None, **options):
    env = ENVS[name](options)
    env.reset(f"{name}-{seed}", seed, split)
    env.sandbox = sandbox
    return env


def optimal_plan(env):
    if isinstance(env, SudokuEnv):
        return env.solution_moves()
    return env.solution()


def plan_answer(moves):
    return f"Let me think about it.\n#### {json.dumps(moves)}"


def blocked_direction(env):
    """A direction the player cannot move in from the start, or None."""
    rules = env.rules()
    legal = rules.split("Legal moves from here: ")[1].rstrip(".").split(", ")
    blocked = [m for m in "UDLR" if m not in legal]
    return blocked[0] if blocked else None


# ---- plan agent ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ENVS)
def test_optimal_plan_succeeds(name):
    env = make(name)
    assert env.spec.agents == ("tool", "plan") and env.spec.turn_order == ("tool", "plan")
    assert env.task_ids("train") is None
    r = run(env.step("plan", plan_answer(optimal_plan(env))))
    assert (r.done, r.success, r.team_reward) == (True, True, 1.0), r
    assert r.local_reward > 0
    # the episode is over: more steps are answered, never raised
    again = run(env.step("plan", plan_answer(["U"])))
    assert again.done and again.success and again.local_reward == 0.0


def test_plan_path_rewards_match_the_reference_values():
    env = make("plan_path", seed=3)
    path = env.solution()
    r = run(env.step("plan", plan_answer(path)))
    assert r.info["optimal"] is True
    # per move -0.01 + shaping +1, then goal +1 and optimal +0.5
    assert r.local_reward == pytest.approx(0.99 * len(path) + 1.5)
    # a detour first: reaching the goal later earns no optimal bonus
    env = make("plan_path", seed=3)
    first = path[0]
    back = {"U": "D", "D": "U", "L": "R", "R": "L"}[first]
    r = run(env.step("plan", plan_answer([first, back, *path])))
    assert r.success and r.info["optimal"] is False
    # shaping nets out
    assert r.local_reward == pytest.approx(-0.01 * (len(path) + 2) + len(path) + 1.0)


def test_failing_never_outscores_an_attempt():
    """Well-formed answers score above the failure reward (no incentive to emit garbage).

    Was: walking away was shaped at -1 a move and the answer floored at exactly -0.9 per answer
    (a floor that paid walking away and back, issue 34). Now walking away earns no gain and only
    its costs are charged, by the episode's ledger, which never charges 0.9 or more in total."""
    env = make("plan_path", seed=3, grid_size=8, wall_ratio=0.0)
    away = {"U": "D", "D": "U", "L": "R", "R": "L"}
    back = [away[m] for m in env.solution()]  # walking away from the goal, then into the edge
    r = run(env.step("plan", plan_answer(back * 3)))
    assert r.info["gains"] == 0 and r.info["costs"] > 0.9  # more than the episode's cap
    assert r.local_reward == pytest.approx(-episode_charge(r.info["costs"], 0.9), abs=1e-6)
    assert FAILURE_REWARD < MIN_ANSWER_REWARD < r.local_reward < 0
    # the episode's total stays above the floor
    again = run(env.step("plan", plan_answer(back * 3)))
    assert MIN_ANSWER_REWARD < r.local_reward + again.local_reward < r.local_reward
    worse = run(env.step("plan", "#### nothing"))
    assert worse.local_reward == FAILURE_REWARD < again.local_reward
    custom = make("plan_path", failure_reward=-2, min_answer_reward=-1.5)
    assert run(custom.step("plan", "?")).local_reward == -2.0
    with pytest.raises(ValueError, match="min_answer_reward"):
        PlanPathEnv({"failure_reward": -1, "min_answer_reward": -1})


def test_sokoban_push_rewards():
    env = make("sokoban", seed=1)
    path = env.solution()
    r = run(env.step("plan", plan_answer(path)))
    # win +10, box onto goal +1, steps -0.01 each, shaping 0.1 * (initial distance)
    assert r.local_reward == pytest.approx(11 - 0.01 * len(path) + 0.1 * env.d0)


@pytest.mark.parametrize("name", ["plan_path", "sokoban"])
def test_illegal_move_is_penalised(name):
    for seed in range(50):
        env = make(name, seed)
        move = blocked_direction(env)
        if move:
            break
    before = json.dumps(env.puzzle_json())
    r = run(env.step("plan", plan_answer([move])))
    assert r.local_reward < 0 and r.info["invalid_moves"] == 1
    assert not r.done and json.dumps(env.puzzle_json()) == before
    assert "invalid move" in env.observe("tool")[0]["content"]  # the history says so


def test_sudoku_illegal_writes_are_penalised():
    env = make("sudoku", seed=5)
    ((r0, c0),) = [(r, c) for r in range(4) for c in range(4) if env.givens[r][c]][:1]
    clue = env.givens[r0][c0]
    blank_in_row = next(c for c in range(4) if env.state.grid[r0][c] == 0)
    before = [row[:] for row in env.state.grid]
    moves = [[r0, c0, clue % 4 + 1], [r0, blank_in_row, clue]]  # overwrite a clue; clash in a row
    r = run(env.step("plan", plan_answer(moves)))
    assert r.local_reward == pytest.approx(-0.2)
    assert [m[3] for m in r.info["invalid_moves"]] == [
        "given clue",
        "clashes with its row, column or box",
    ]
    assert env.state.grid == before and not r.done


@pytest.mark.parametrize(
    "name, answer, why",
    [
        ("plan_path", "I would go up then right.", "no '####'"),
        ("plan_path", '#### ["U", "R"', "not closed"),
        ("plan_path", "#### [U, R]", "not valid JSON"),
        ("plan_path", '#### ["U", "X"]', "unknown move 'X'"),
        ("plan_path", "#### []", "empty"),
        ("plan_path", "#### go up", "not followed by a JSON list"),
        ("sokoban", '#### ["up"]', "unknown move 'up'"),
        ("sokoban", '#### {"moves": ["U"]}', "not followed by a JSON list"),
        ("sudoku", "#### [[0, 0]]", "not [row, col, value]"),
        ("sudoku", "#### [[0, 0, 9]]", "out of range"),
        ("sudoku", '#### [[1,2,3,4],[1,2,3,4],[1,2,3,4],[1,2,3,"x"]]', "not an integer"),
        ("sudoku", "#### [[true, 0, 1]]", "not [row, col, value]"),
    ],
)
def test_malformed_plan_scores_and_explains(name, answer, why):
    env = make(name)
    before = json.dumps(env.puzzle_json())
    r = run(env.step("plan", answer))
    assert r.local_reward == FAILURE_REWARD < 0 and not r.done and not r.success
    assert why in r.info["parse_error"], r.info
    assert "####" in r.info["parse_error"]  # says what to do instead
    assert json.dumps(env.puzzle_json()) == before
    assert "answer malformed" in env.observe("plan")[0]["content"]
    assert env.turn == 1


def test_lenient_but_deterministic_list_parsing():
    assert parse_list_after("#### ['U', 'R']", "####") == (["U", "R"], None)
    assert parse_list_after('#### Step 1\nfoo\n#### ["L"] done', "####") == (["L"], None)
    assert parse_list_after('**Actions List**: ["a]"]', "**Actions List**:") == (["a]"], None)
    env = make("plan_path")
    r = run(env.step("plan", '#### ["u", " r "]'))
    assert r.info["actions"] == ["U", "R"]


# ---- tool agent ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ENVS)
def test_tool_agent_with_a_correct_solver(name, sandbox):
    env = make(name, seed=7, sandbox=sandbox)
    state_before = json.dumps(env.puzzle_json())
    r = run(env.step("tool", fenced(SOLVERS[name])))
    assert r.info.get("verdict") == "ok", r.info
    assert r.local_reward > 0 and r.info["would_solve"] is True
    assert not r.done and r.team_reward == 0.0
    assert json.dumps(env.puzzle_json()) == state_before  # simulated, not applied
    prompt = env.observe("plan")[0]["content"]
    actions = r.info["actions"]
    assert moves_text(actions) in prompt
    assert "searching with" in prompt  # its stdout
    assert "def solve(p):" in prompt  # its code
    # the plan agent follows the proposal and wins
    p = run(env.step("plan", plan_answer(actions)))
    assert p.success and p.done and p.local_reward == pytest.approx(r.local_reward)
    # the next turn's prompt recalls what happened
    assert "Turn 1: tool proposed" in env.observe("tool")[0]["content"]


@pytest.mark.parametrize("name", ENVS)
def test_tool_agent_crash_scores_failure(name, sandbox):
    env = make(name, sandbox=sandbox)
    r = run(
        env.step(
            "tool",
            fenced("import json, sys\npuzzle = json.load(sys.stdin)\nprint(puzzle['nope'])\n"),
        )
    )
    assert r.local_reward == FAILURE_REWARD and not r.done
    assert r.info["verdict"] == "runtime_error"
    assert "KeyError" in r.info["exec_error"]
    prompt = env.observe("plan")[0]["content"]
    assert "proposed no actions" in prompt and "KeyError" in prompt


def test_tool_agent_loop_times_out(sandbox):
    env = make("plan_path", sandbox=sandbox, tool_timeout_s=0.5)
    r = run(env.step("tool", fenced("while True:\n    pass\n")))
    assert r.local_reward == FAILURE_REWARD
    assert r.info["verdict"] == "timeout" and "time limit" in r.info["exec_error"]


@pytest.mark.parametrize(
    "answer, key, why",
    [
        ("I think the answer is U R.", "parse_error", "no ```python code block"),
        (fenced("print('done')\n"), "parse_error", "no actions list"),
        (fenced("print('**Actions List**: [\"Z\"]')\n"), "parse_error", "unknown move 'Z'"),
    ],
)
def test_tool_agent_output_problems(answer, key, why, sandbox):
    env = make("plan_path", sandbox=sandbox)
    r = run(env.step("tool", answer))
    assert r.local_reward == FAILURE_REWARD and why in r.info[key], r.info


def test_tool_agent_without_a_sandbox():
    env = make("sokoban")
    r = run(env.step("tool", fenced(SOKOBAN_SOLVER)))
    assert r.local_reward == FAILURE_REWARD and r.info["exec_error"] == "no sandbox configured"
    assert "no sandbox configured" in env.observe("plan")[0]["content"]


def test_tool_agent_sandbox_errors_are_scored_not_raised():
    class Broken:
        async def execute(self, code, **kwargs):
            raise ConnectionError("sandbox down")

    env = make("plan_path", sandbox=Broken())
    r = run(env.step("tool", fenced(PATH_SOLVER)))
    assert (
        r.local_reward == FAILURE_REWARD
        and "sandbox down" in r.info["exec_error"]
        and r.info["sandbox_error"]
    )


# ---- forks, seeds, generation ----------------------------------------------------------------


@pytest.mark.parametrize("name", ENVS)
def test_fork_is_independent(name):
    env = make(name, seed=2)
    sandbox = object()
    env.sandbox = sandbox
    tool_before, plan_before = env.observe("tool"), env.observe("plan")
    fork = env.fork()
    assert fork.sandbox is sandbox
    run(fork.step("plan", plan_answer(optimal_plan(fork)[:1])))
    assert fork.observe("tool") != tool_before
    assert env.observe("tool") == tool_before and env.observe("plan") == plan_before
    assert env.turn == 0 and not env.history
    # and the other way round
    run(env.step("plan", "no answer"))
    assert fork.history[0]["plan"].startswith("played")


@pytest.mark.parametrize("name", ENVS)
def test_seeds_determine_the_puzzle(name):
    def puzzle(seed, split="train"):
        return json.dumps(make(name, seed, split).puzzle_json())

    assert puzzle(11) == puzzle(11)
    assert len({puzzle(s) for s in range(10)}) == 10
    assert puzzle(11, "train") != puzzle(11, "eval")


def test_plan_path_generation_respects_options():
    env = make("plan_path", seed=4, grid_size=6, wall_ratio=0.0)
    grid = env.puzzle_json()["grid"]
    assert len(grid) == 6 and all(row == "......" for row in grid)
    assert env.optimum == len(env.solution()) >= 2
    assert load(PATH_SOLVER)["solve"](env.puzzle_json()) is not None
    with pytest.raises(ValueError, match="grid_size"):
        PlanPathEnv({"grid_size": 1})
    assert PlanPathEnv({"max_turns": 9}).spec.max_turns == 9


def test_sokoban_rooms_are_solvable():
    solve = load(SOKOBAN_SOLVER)["solve"]
    for seed in range(50):
        env = make("sokoban", seed)
        puzzle = env.puzzle_json()
        assert len(puzzle["boxes"]) == len(puzzle["goals"]) == 1
        assert not set(map(tuple, puzzle["boxes"])) & set(map(tuple, puzzle["goals"]))
        path = solve(puzzle)
        assert path, f"seed {seed}: room not solvable\n" + "\n".join(puzzle["grid"])
        assert len(path) == len(env.solution())  # both BFS: the same optimum
        r = run(env.step("plan", plan_answer(path)))
        assert r.success, seed
    two = make("sokoban", 3, size=7, boxes=2)
    assert len(two.puzzle_json()["boxes"]) == 2 and solve(two.puzzle_json())
    with pytest.raises(ValueError, match="boxes"):
        SokobanEnv({"boxes": 5})


def test_sokoban_dead_square_fails_the_episode():
    for seed in range(200):
        env = make("sokoban", seed)
        st = env.state
        box = st.boxes[0]
        for m, (dr, dc) in {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}.items():
            behind, target = (box[0] - dr, box[1] - dc), (box[0] + dr, box[1] + dc)
            if st.player == behind and target in env.dead and target in env.floor:
                r = run(env.step("plan", plan_answer([m])))
                assert r.done and not r.success and r.info["failed"] and r.team_reward == 0.0
                # fail 5 + step 0.01 are costs (was: floored at exactly -0.9 per answer; now the
                # episode's charge, which stays below 0.9); a push nearer a goal may still gain 0.1
                assert r.info["costs"] == pytest.approx(5.01) and r.info["gains"] in (0.0, 0.1)
                assert r.local_reward == pytest.approx(
                    r.info["gains"] - episode_charge(5.01, 0.9), abs=1e-6
                )
                assert MIN_ANSWER_REWARD < r.local_reward - r.info["gains"] < -0.89
                assert "dead square" in r.info["failure"]
                return
    pytest.fail("no room among 200 seeds has the player next to a push into a dead square")


@pytest.mark.parametrize("size", [4, 9])
def test_sudoku_puzzles_have_unique_solutions(size):
    solutions = load(SUDOKU_SOLVER)["solutions"]
    b = {4: 2, 9: 3}[size]
    for seed in range(20):
        env = make("sudoku", seed, size=size)
        grid = env.puzzle_json()["grid"]
        found = solutions([row[:] for row in grid], size, b, 2)
        assert len(found) == 1, f"seed {seed}"
        assert found[0] == [list(row) for row in env.solution]
        assert count_solutions(grid) == 1
        assert sum(v != 0 for row in grid for v in row) >= env.min_clues


def test_sudoku_generation_is_fast():
    import time

    worst = 0.0
    for seed in range(10):
        t = time.perf_counter()
        make("sudoku", seed, size=9, min_clues=0)  # as few clues as uniqueness allows
        worst = max(worst, time.perf_counter() - t)
    assert worst < 0.5  # typically < 0.1 s; generous on a loaded machine


def test_sudoku_success_requires_the_given_clues():
    env = make("sudoku", seed=8)
    solution = [list(row) for row in env.solution]
    # A valid Sudoku that relabels the digits: it changes the clues, so it is rejected whole.
    relabel = {1: 2, 2: 1, 3: 3, 4: 4}
    other = [[relabel[v] for v in row] for row in solution]
    before = [row[:] for row in env.state.grid]
    r = run(env.step("plan", plan_answer(other)))
    assert not r.success and not r.done
    assert r.info["clue_conflicts"] and env.state.grid == before
    assert r.local_reward == pytest.approx(
        max(-0.1 * len(r.info["clue_conflicts"]), MIN_ANSWER_REWARD)
    )
    # the right full grid solves it, keeping every clue
    r = run(env.step("plan", plan_answer(solution)))
    assert r.success and r.done and r.local_reward == pytest.approx(3.0)
    assert all(
        env.state.grid[r_][c] == g
        for r_, row in enumerate(env.givens)
        for c, g in enumerate(row)
        if g
    )


def test_sudoku_partial_progress_is_shaped():
    env = make("sudoku", seed=9)
    moves = env.solution_moves()
    r = run(env.step("plan", plan_answer(moves[:2])))
    assert r.team_reward == pytest.approx(2 / env.blanks, abs=1e-6)  # rewards are rounded to 1e-6
    assert r.local_reward == pytest.approx(2 / env.blanks, abs=1e-6)
    # clearing a filled cell takes the progress back (a cost of 1/blanks) ...
    r = run(env.step("plan", plan_answer([[moves[0][0], moves[0][1], 0]])))
    assert r.local_reward == pytest.approx(-1 / env.blanks, abs=1e-6)
    assert r.team_reward == pytest.approx(1 / env.blanks, abs=1e-6)
    # ... and writing it again earns nothing (was: +1/blanks again, so clearing and rewriting broke
    # even; issue 34: progress is paid once); a cell never right before earns 1/blanks
    r = run(env.step("plan", plan_answer([moves[0]])))
    assert r.local_reward == 0.0 and r.team_reward == pytest.approx(2 / env.blanks, abs=1e-6)
    r = run(env.step("plan", plan_answer([moves[2]])))
    assert r.local_reward == pytest.approx(1 / env.blanks, abs=1e-6)
    assert "Cells filled so far" in env.observe("plan")[0]["content"]


def test_prompts_are_deterministic_and_carry_the_format():
    for name in ENVS:
        a, b = make(name, 5), make(name, 5)
        assert a.observe("tool") == b.observe("tool") and a.observe("plan") == b.observe("plan")
        tool, plan = a.observe("tool")[0]["content"], a.observe("plan")[0]["content"]
        assert "```python" in tool and "**Actions List**:" in tool
        assert "#### " in plan and "The tool agent has not acted this turn." in plan
        with pytest.raises(ValueError, match="unknown agent"):
            a.observe("critic")


@pytest.mark.parametrize("name", ENVS)
def test_plan_agent_alone(name):
    """L0: with turn_order [plan] the plan agent plays alone and its prompt mentions no tool
    agent."""
    env = make(name, turn_order=["plan"])
    assert env.spec.turn_order == ("plan",)
    (prompt,) = env.observe("plan")
    assert "alone" in prompt["content"] and "tool agent" not in prompt["content"]
    r = run(env.step("plan", plan_answer(optimal_plan(env))))
    assert (r.done, r.success, r.team_reward) == (True, True, 1.0)


def test_tool_agent_alone_is_refused():
    with pytest.raises(ValueError, match="never plays a move"):
        make("plan_path", turn_order=["tool"])

"""`Environment.demonstration`: the envs' own solvers speaking as their agents. Episodes where
every agent, in turn order, answers with its demonstration (the tool agents' programs run in a
real bwrap sandbox) end in success, each answer earning the most a right answer earns."""

import asyncio

import pytest

from atgrpo.sdk.env import Environment
from env_svc.envs.math import MathEnv
from env_svc.envs.plan_answers import DIRECTIONS
from env_svc.envs.plan_ledger import episode_charge
from env_svc.envs.plan_path import PlanPathEnv
from env_svc.envs.planning import MIN_ANSWER_REWARD
from env_svc.envs.reasoning_gym import ReasoningGymEnv
from env_svc.envs.sokoban import SokobanEnv, box_distance
from env_svc.envs.sudoku import SudokuEnv

TASKS = 12  # train tasks per env and options
M = -MIN_ANSWER_REWARD  # the most an episode's costs are charged


def make(cls, options, seeds=range(TASKS), sandbox=None):
    envs = []
    for seed in seeds:
        env = cls(options)
        env.reset(f"train-{seed}", seed, "train")
        env.sandbox = sandbox
        envs.append(env)
    return envs


async def play(env):
    """Each agent of the turn order answers with its demonstration until the episode is done: the
    (agent, result) of every step."""
    steps = []
    for _ in range(env.spec.max_turns):
        for agent in env.spec.turn_order:
            demo = env.demonstration(agent)
            assert demo is not None, (env.name, agent)
            before = env.observe(agent)
            assert env.demonstration(agent) == demo and env.observe(agent) == before  # no effect
            result = await env.step(agent, demo)
            steps.append((agent, result))
            if result.done:
                assert env.demonstration(agent) is None  # nothing is right once it is over
                return steps
    return steps


def play_all(envs):
    """play() for every env, two at a time (the sandbox's workers; the planning envs do not wait
    for a busy sandbox)."""

    async def main():
        slots = asyncio.Semaphore(2)

        async def one(env):
            async with slots:
                return await play(env)

        return await asyncio.gather(*(one(env) for env in envs))

    return asyncio.run(main())


def test_the_base_class_has_none():
    class Bare(Environment):
        name = "bare"

    assert Bare().demonstration("any") is None


# ---- planning: a search program for the tool agent, the optimal moves for the plan agent --------


def check_planning(envs, best):
    """Every episode is solved in its first turn; each agent's reward is `best(env, agent)`."""
    expected = [{a: best(env, a) for a in env.spec.turn_order} for env in envs]
    for env, want, steps in zip(envs, expected, play_all(envs), strict=True):
        assert [a for a, _ in steps] == list(env.spec.turn_order), steps
        last = steps[-1][1]
        assert (last.done, last.success, last.team_reward) == (True, True, 1.0), last
        for agent, result in steps:
            assert result.local_reward == pytest.approx(want[agent], abs=1e-6), (agent, result)
            if agent == "tool":
                assert result.info["would_solve"], result.info


@pytest.mark.parametrize("options", [{"grid_size": 6}, {}, {"turn_order": ["plan"]}])
def test_plan_path(sandbox, options):
    def best(env, agent):
        d0 = env.optimum  # an optimal solve: every step of distance, the goal and the optimum bonus
        return d0 + 1.0 + 0.5 - episode_charge(0.01 * d0, M)

    check_planning(make(PlanPathEnv, options, sandbox=sandbox), best)


@pytest.mark.parametrize("options", [{"size": 5}, {"size": 6}])
def test_sokoban_one_box(sandbox, options):
    def best(env, agent):
        moves = len(env.solution())  # the fewest moves (the env's own BFS)
        return 1.0 + 0.1 * env.d0 + 10.0 - episode_charge(0.01 * moves, M)

    check_planning(make(SokobanEnv, options, sandbox=sandbox), best)


def test_sokoban_two_boxes(sandbox):
    """Two boxes: a fewest-moves solve earns every gain there is (each goal, the distance, the
    win); its costs are its steps (and a push off a goal on the way, if it makes one)."""
    envs = make(SokobanEnv, {"size": 6, "boxes": 2}, seeds=range(6), sandbox=sandbox)
    gains = [2.0 + 0.1 * box_distance(env.state.boxes, env.goals) for env in envs]
    moves = [len(env.solution()) for env in envs]
    for env, most, n, steps in zip(envs, gains, moves, play_all(envs), strict=True):
        assert steps[-1][1].success and env.state.moves == n
        for _, result in steps:
            assert result.info["gains"] == pytest.approx(most + 10.0), result.info
            assert result.info["costs"] >= 0.01 * n - 1e-9


@pytest.mark.parametrize("options", [{"size": 4}, {"size": 9}])
def test_sudoku(sandbox, options):
    envs = make(SudokuEnv, options, seeds=range(6), sandbox=sandbox)
    check_planning(envs, lambda env, agent: 3.0)  # every blank right (+1) and solved (+2), no cost


def test_planning_mid_episode(sandbox):
    """From a state the plan agent left off the path, the demonstrations still solve it."""
    env = make(PlanPathEnv, {}, seeds=[3], sandbox=sandbox)[0]
    r, c = env.state.pos
    away = max(  # the move that leaves the walker farthest from the goal (a wall: it stays)
        DIRECTIONS, key=lambda m: env.dist.get((r + DIRECTIONS[m][0], c + DIRECTIONS[m][1]), -1)
    )
    assert not asyncio.run(env.step("plan", f'#### ["{away}"]')).done
    steps = play_all([env])[0]
    assert steps[-1][1].success and env.turn == 2


# ---- reasoning_gym: the reference answer; a program computing it where the entry allows --------

ARITHMETIC = {"min_terms": 2, "max_terms": 4, "operators": ["+", "-", "*"]}


@pytest.mark.parametrize(
    "dataset, config",
    [
        ("basic_arithmetic", {**ARITHMETIC, "min_digits": 1, "max_digits": 1}),
        ("basic_arithmetic", {**ARITHMETIC, "min_digits": 3, "max_digits": 3}),
        ("basic_arithmetic", {}),  # the default: / (floor division), parentheses, negation
        ("basic_arithmetic", {**ARITHMETIC, "allow_parentheses": False}),  # left to right
        ("letter_counting", {}),
    ],
)
def test_reasoning_gym(sandbox, dataset, config):
    options = {"dataset": dataset, "dataset_config": config}
    envs = make(ReasoningGymEnv, options, seeds=range(16), sandbox=sandbox)
    for steps in play_all(envs):
        assert [a for a, _ in steps] == ["tool", "reasoner"]
        (_, tool), (_, reasoner) = steps
        assert tool.local_reward == 1.0 and tool.info["score"] == 1.0, tool.info
        assert (reasoner.local_reward, reasoner.team_reward) == (1.0, 1.0), reasoner.info
        assert reasoner.done and reasoner.success


def test_reasoning_gym_without_a_program():
    """Where no program derives the answer, the tool agent has none; the reasoner still does."""
    env = make(ReasoningGymEnv, {"dataset": "leg_counting"}, [0])[0]
    assert env.demonstration("tool") is None
    result = asyncio.run(env.step("reasoner", env.demonstration("reasoner")))
    assert result.success and result.local_reward == 1.0
    simple = {**ARITHMETIC, "operators": ["+", "/"], "allow_parentheses": False}
    divides = [
        env
        for env in make(ReasoningGymEnv, {"dataset": "basic_arithmetic", "dataset_config": simple})
        if "/" in env.entry["metadata"]["expression"]
    ]
    assert divides and all(env.demonstration("tool") is None for env in divides)


def test_math_reasoner():
    env = MathEnv({"turn_order": ["reasoner"]})
    env.reset("train-half-of-third", 0, "train")
    assert env.demonstration("reasoner") == "\\boxed{\\frac{1}{6}}"
    result = asyncio.run(env.step("reasoner", env.demonstration("reasoner")))
    assert (result.local_reward, result.done, result.success) == (1.0, True, True)
    assert MathEnv({}).demonstration("tool") is None

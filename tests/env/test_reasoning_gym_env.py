"""The `reasoning_gym` environment: any reasoning-gym dataset as an episode source, scored by the
dataset's own score_answer; in-process, and through the real env_svc and sandbox_svc over gRPC."""

import asyncio
import re
import sys

import pytest
import reasoning_gym as rg  # make install brings it: the benchmarks extra

from atgrpo import errors
from atgrpo.sdk.env import EVAL_SEED_OFFSET
from atgrpo.sdk.host import EnvHost
from atgrpo.sdk.registry import Registry
from env_svc.envs import BUILTIN
from env_svc.envs.common import FAILURE_REWARD
from env_svc.envs.reasoning_gym import ReasoningGymEnv, _dataset

ARITHMETIC = {
    "dataset": "basic_arithmetic",
    "dataset_config": {
        "min_terms": 2,
        "max_terms": 3,
        "max_digits": 2,
        "operators": ["+", "-", "*"],
    },
}


def run(coro):
    return asyncio.run(coro)


def make(seed=0, split="train", **options):
    env = ReasoningGymEnv({"turn_order": ["reasoner"], **ARITHMETIC, **options})
    env.reset(f"{split}-{seed}", seed, split)
    return env


def reference(name, index, split="eval", size=200, data_seed=0, **config):
    """The entry the env must serve: reasoning-gym's own, from the documented seeds."""
    seed = data_seed + (EVAL_SEED_OFFSET if split == "eval" else 0)
    return rg.create_dataset(name, seed=seed, size=size, **config)[index]


def test_rewards_by_value():
    env = make()
    answer = env.entry["answer"]
    wrong = run(env.step("reasoner", f"I think <answer>{int(answer) + 1}</answer>"))
    assert (wrong.team_reward, wrong.local_reward, wrong.done, wrong.success) == (
        0.0,
        0.0,
        False,
        False,
    )
    assert wrong.info == {"answer": str(int(answer) + 1), "score": 0.0}
    right = run(make().step("reasoner", f"<think>easy</think>\n<answer> {answer} </answer>"))
    assert (right.team_reward, right.local_reward, right.done, right.success) == (
        1.0,
        1.0,
        True,
        True,
    )
    boxed = run(make().step("reasoner", f"so \\boxed{{{answer}}}"))  # a fallback, like math's
    assert boxed.local_reward == 1.0
    none = run(make().step("reasoner", "I am not sure."))
    assert (
        none.local_reward == FAILURE_REWARD
        and "<answer>" in none.info["parse_error"]
        and not none.done
    )


def test_partial_credit_is_paid_only_where_audited():
    """mini_sudoku's positional credit pays constants (a grid of ones: 0.225), so the env pays its
    verdict of right only; tower_of_hanoi's credit for a longer solution is progress and stays."""
    env = make(dataset="mini_sudoku", dataset_config={})
    grid = env.entry["answer"]
    assert run(env.fork().step("reasoner", f"<answer>\n{grid}\n</answer>")).local_reward == 1.0
    first = grid[0]
    one_off = str(int(first) % 4 + 1) + grid[1:]  # one of 16 digits wrong
    assert env.dataset.score_answer(one_off, env.entry) == pytest.approx(0.9 * 15 / 16)
    r = run(env.step("reasoner", f"<answer>\n{one_off}\n</answer>"))
    assert r.local_reward == r.team_reward == 0.0 and not r.success
    hanoi = make(dataset="tower_of_hanoi", dataset_config={})
    start, moves = hanoi.entry["metadata"]["start_peg"], hanoi.entry["answer"].splitlines()
    spare = next(p for p in (1, 2, 3) if p != start)
    detour = [f"Move disk 1 from Peg {a} to Peg {b}" for a, b in ((start, spare), (spare, start))]
    r = run(hanoi.step("reasoner", "<answer>" + "\n".join(detour + moves) + "</answer>"))
    assert r.local_reward == pytest.approx(len(moves) / (len(moves) + 2)) and not r.success


def test_seeds_pick_reproducible_entries_and_splits_differ():
    def question(seed, split="train", **options):
        return make(seed, split, **options).entry["question"]

    assert question(3) == question(3)
    assert len({question(s) for s in range(20)}) > 15  # arithmetic may repeat by chance
    assert question(3) != question(EVAL_SEED_OFFSET + 3, "eval")
    assert question(3) != question(3, data_seed=1)
    # the documented mapping: eval seed OFFSET + i is entry i of the eval dataset; seeds wrap by
    # size
    config = ARITHMETIC["dataset_config"]
    assert (
        question(EVAL_SEED_OFFSET + 5, "eval")
        == reference("basic_arithmetic", 5, **config)["question"]
    )
    assert question(EVAL_SEED_OFFSET + 205, "eval") == question(EVAL_SEED_OFFSET + 5, "eval")
    assert (
        question(12, train_size=10)
        == reference("basic_arithmetic", 2, "train", 10, **config)["question"]
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dataset": "no_such_task"}, "unknown dataset 'no_such_task'; use one of reasoning-gym's"),
        ({}, "the option `dataset` is required"),
        (
            {"dataset": "sudoku", "dataset_config": {"min_empty": 99}},
            "min_empty must be between 0 and 64",
        ),
        (
            {"dataset": "sudoku", "dataset_config": {"bogus": 1}},
            "unexpected keyword argument 'bogus'",
        ),
        ({"dataset": "sudoku", "dataset_config": {"seed": 1}}, "use the options data_seed"),
        ({"dataset": "sudoku", "eval_size": 0}, "eval_size must be in 1.."),
        ({"dataset": "sudoku", "turn_order": ["critic"]}, "turn_order"),
    ],
)
def test_config_errors_say_what_to_write(options, message):
    host = EnvHost(Registry(BUILTIN, discover=False))
    with pytest.raises(errors.InvalidArgument, match=re.escape(message)):
        host.describe("reasoning_gym", {"turn_order": ["reasoner"], **options})


def test_missing_package_names_the_extra(monkeypatch):
    _dataset.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what `import` sees when it is absent
    with pytest.raises(ValueError, match=re.escape("pip install 'atgrpo[benchmarks]'")):
        ReasoningGymEnv({"dataset": "leg_counting"})
    assert ReasoningGymEnv().spec.name == "reasoning_gym"  # a listing still describes it


def test_a_listing_needs_no_dataset_but_reset_does():
    env = ReasoningGymEnv()
    assert (
        env.spec.agents == env.spec.turn_order == ("tool", "reasoner") and env.spec.max_turns == 1
    )
    with pytest.raises(errors.InvalidArgument, match="needs the option `dataset`"):
        env.reset("t", 0, "train")


# ---- through the real env_svc and sandbox_svc ------------------------------------------------


def test_tool_and_reasoner_over_grpc(env_address):
    """basic_arithmetic at L1: the tool's program runs in the sandbox service and scores 1.0, the
    reasoner sees its answer; a wrong reasoner answer scores 0 and the episode goes on."""
    from atgrpo.sdk.client import EnvClient

    options = {**ARITHMETIC, "max_turns": 2, "eval_size": 20}

    async def go():
        async with EnvClient(env_address) as c:
            for i in range(3):
                ep, spec = await c.reset(
                    "reasoning_gym", f"eval-{i}", EVAL_SEED_OFFSET + i, "eval", options
                )
                assert spec.turn_order == ("tool", "reasoner")
                (tool_prompt,), _ = await c.observe(ep, "tool")
                expr = re.search(r"Calculate (.*?)\.?\n", tool_prompt["content"]).group(1)
                tool = await c.step(ep, "tool", f"```python\nprint({expr})\n```")
                assert tool.local_reward == 1.0 and tool.info["verdict"] == "ok", tool.info
                (prompt,), _ = await c.observe(ep, "reasoner")
                value = str(eval(expr))  # the test's own arithmetic
                assert f"The tool agent's answer: {value}" in prompt["content"]
                (wrong_ep,) = await c.fork(ep, 1)
                wrong = await c.step(wrong_ep, "reasoner", f"<answer>{int(value) + 7}</answer>")
                assert (wrong.local_reward, wrong.team_reward, wrong.done) == (0.0, 0.0, False)
                right = await c.step(ep, "reasoner", f"<answer>{value}</answer>")
                assert (right.local_reward, right.team_reward, right.done, right.success) == (
                    1.0,
                    1.0,
                    True,
                    True,
                )
                crash = await c.step(wrong_ep, "tool", "```python\nraise SystemExit(3)\n```")
                assert crash.local_reward == FAILURE_REWARD and "exec_error" in crash.info
                await c.close_episodes([ep, wrong_ep])

    asyncio.run(go())


def test_sudoku_family_over_grpc(env_address):
    """mini_sudoku at L0: the served puzzle is reasoning-gym's own eval entry; its reference
    scores 1.0 and a grid with one digit wrong the dataset's partial credit."""
    from atgrpo.sdk.client import EnvClient

    options = {"dataset": "mini_sudoku", "turn_order": ["reasoner"], "eval_size": 50}

    async def go():
        async with EnvClient(env_address) as c:
            for i in range(3):
                entry = reference("mini_sudoku", i, size=50)
                ep, _ = await c.reset(
                    "reasoning_gym", f"eval-{i}", EVAL_SEED_OFFSET + i, "eval", options
                )
                (prompt,), _ = await c.observe(ep, "reasoner")
                assert entry["question"] in prompt["content"]
                (bad_ep,) = await c.fork(ep, 1)
                grid = entry["answer"]
                bad = await c.step(
                    bad_ep, "reasoner", f"<answer>{str(int(grid[0]) % 4 + 1) + grid[1:]}</answer>"
                )
                # done: one turn; no positional credit (rg_credit.py)
                assert bad.local_reward == 0.0 and not bad.success
                good = await c.step(ep, "reasoner", f"<answer>\n{grid}\n</answer>")
                assert (good.local_reward, good.done, good.success) == (1.0, True, True)
                await c.close_episodes([ep, bad_ep])

    asyncio.run(go())


def test_the_docs_example_builds():
    import yaml

    from tests.conftest import ROOT

    doc = (ROOT / "docs" / "environments.md").read_text()
    section = doc.split("## The built-in `reasoning_gym` environment", 1)[1]
    env = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))["env"]
    built = ReasoningGymEnv(env["options"])
    assert (
        built.spec.turn_order == tuple(env["turn_order"])
        and built.spec.max_turns == env["max_turns"]
    )

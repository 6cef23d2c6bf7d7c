"""Constant answers against every reasoning-gym dataset the env serves, through the env's real
judge (`ReasoningGymEnv.step`, the scorer worker for the datasets it scores): a constant earns
nothing on an entry unless it is that entry's right answer (DESIGN.md 4b).

The chance rate of a constant on a dataset is the fraction of entries it is right on: its text
equals the reference (case and spacing aside) or both are the same numbers ("0" and "0.0").
That is a real rate where the answer space is small (game_of_life_halting's "True" and "False",
about half each; coin_flip's "1", 1 in 10; a grid of zeros where the next Game of Life state is
empty). Everywhere else the constant must earn exactly nothing: partial credit for a constant
is a hole (a format reward, closeness to the typical answer, cells a fixed grid shares with most
references), whatever the dataset's scorer meant by it.

The full sweep (every dataset, 20 entries, every constant, each entry's reference too) is the
slow tier; the quick tier replays the constants that paid most before rg_credit.py, on the
datasets they paid on.
"""

import asyncio

import pytest
import reasoning_gym as rg

from env_svc.envs.reasoning_gym import ReasoningGymEnv, dataset_names
from env_svc.envs.rg_credit import NEAR, PARTIAL, REFUSED, credit
from env_svc.envs.rg_safe import score_coin_flip, score_game_of_life_halting

ENTRIES = 20
ZEROS = "[" + ",".join(["[" + ",".join(["0"] * 10) + "]"] * 10) + "]"  # game_of_life's 10x10
ONES_4 = "\n".join(["1 1 1 1"] * 4)  # one right cell per row of any 4x4 sudoku
ONES_9 = "\n".join([" ".join(["1"] * 9)] * 9)
TAUTOLOGY = "P ∨ ¬P"
CONSTANTS = [
    *("", "0", "1", "2", "-1", "10", "0.0", "yes", "no", "True", "False", "A", "none"),
    *("[]", "{}", "00:00", "Monday", TAUTOLOGY, ZEROS, ONES_4, ONES_9, "ab" * 200),
]
# What each constant earned on average before rg_credit.py, 20 entries (the sweep's figures).
WORST = {
    "game_of_life_halting": ["yes", "True", "False", "0"],  # 1.0 each: any answer was right
    "coin_flip": ["0", "0.0"],  # 0.90: prefix credit, and 1e-4 absolute on tiny probabilities
    "game_of_life": [ZEROS],  # 0.96: cell-wise credit
    "time_intervals": ["00:00", "10"],  # 0.44, 0.11: closeness
    "polynomial_equations": ["0", "0, 0"],  # 0.35, 0.27: closeness
    "rectangle_count": ["1", "2"],  # 0.25, 0.31: closeness
    "propositional_logic": [TAUTOLOGY, "yes"],  # 0.25 (a tautology), 0.09: format reward
    "mini_sudoku": [ONES_4],  # 0.23: positional credit
    "calendar_arithmetic": ["Monday", "10"],  # 0.19 (0.15 right), 0.04: any weekday, closeness
    "countdown": ["1"],  # 0.05: format reward, ours
    "sentence_reordering": ["yes"],  # 0.05: format reward
}


def right(constant: str, reference: str) -> bool:
    """The constant is this entry's answer: the same text, or the same numbers."""
    if " ".join(constant.split()).casefold() == " ".join(reference.split()).casefold():
        return True
    return (numbers := _numbers(constant)) is not None and numbers == _numbers(reference)


def _numbers(text: str) -> list[float] | None:
    try:
        return sorted(float(part) for part in text.split(","))
    except ValueError:
        return None


def credits(name: str, constants: list[str], entries: int, references: bool = False) -> dict:
    """For each constant, per entry: (credit paid, whether it is right, the reference); with
    `references`, under the key None: each entry's own reference answered."""
    env = ReasoningGymEnv(
        {"turn_order": ["reasoner"], "dataset": name, "train_size": entries, "max_turns": 1}
    )
    out: dict[str | None, list[tuple]] = {c: [] for c in constants}
    for seed in range(entries):
        env.reset(f"train-{seed}", seed, "train")
        reference = str(env.entry["answer"])
        answers = {c: f"<answer>{c}</answer>" for c in constants}
        demonstration = env.demonstration("reasoner")
        # None where the entry has no single answer (graph_color, rubiks_cube, ...) or an empty
        # one; sympy's unevaluated Integral is refused by our gate even in a reference (rg_safe)
        if references and demonstration is not None and "Integral" not in demonstration:
            answers[None] = demonstration
        for key, text in answers.items():
            step = asyncio.run(env.fork().step("reasoner", text))
            ok = key is None or right(key, reference)
            out.setdefault(key, []).append((step.local_reward, ok, reference))
    return out


def assert_at_chance(name: str, paid: dict[str, list[tuple]]) -> None:
    for constant, rows in paid.items():
        mean = sum(max(credit, 0.0) for credit, _, _ in rows) / len(rows)
        chance = sum(ok for _, ok, _ in rows) / len(rows)
        wrong_paid = [
            (i, credit, ref[:40])
            for i, (credit, ok, ref) in enumerate(rows)
            if credit > 0 and not ok
        ]
        assert not wrong_paid, (
            f"{name}: the constant {constant[:40]!r} earned {mean:.3f} on average, its chance "
            f"rate is {chance:.2f}; paid where it is wrong (entry, credit, reference): "
            f"{wrong_paid[:5]}"
        )
        assert mean <= chance + 1e-9


@pytest.mark.parametrize("name", sorted(WORST))
def test_the_constants_that_paid_most_earn_only_their_chance(name):
    assert_at_chance(name, credits(name, WORST[name], 10))


def shipped() -> list[str]:
    """reasoning-gym's own datasets: not those other test modules register in the same process
    (tests/env/rg_probe.py's, whose scorer pays anything on purpose)."""
    from reasoning_gym.factory import DATASETS

    return [
        n
        for n in dataset_names()
        if n not in REFUSED and DATASETS[n][0].__module__.startswith("reasoning_gym.")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", shipped())
def test_no_constant_beats_chance_on_any_dataset(name):
    """Every dataset, 20 entries, every constant; and the judge still pays 1.0 for each entry's
    reference answer (its demonstration), where it has one."""
    paid = credits(name, CONSTANTS, ENTRIES, references=True)
    unpaid = [ref[:40] for credit, _, ref in paid.pop(None, []) if credit != 1.0]
    assert not unpaid, f"{name}: its own reference answers earn under 1.0: {unpaid[:5]}"
    assert_at_chance(name, paid)


def test_the_halting_and_coin_flip_scorers_pay_only_right_answers():
    ds = rg.create_dataset("game_of_life_halting", seed=0, size=20)
    for i in range(20):
        entry = ds[i]
        other = "False" if entry["answer"] == "True" else "True"
        assert score_game_of_life_halting(ds, f" {entry['answer'].lower()} ", entry) == 1.0
        for wrong in (other, "yes", "1", "[]", entry["answer"] + "!"):
            assert ds.score_answer(wrong, entry) == 1.0  # the hole, in the dataset's scorer
            assert score_game_of_life_halting(ds, wrong, entry) == 0.0
    coins = rg.create_dataset("coin_flip", seed=0, size=50)
    for i in range(50):
        assert score_coin_flip(coins, coins[i]["answer"], coins[i]) == 1.0
    tiny = {"answer": "3.051757812e-05"}  # 1/32768
    for honest in ("1/32768", "0.0000305", "3.05e-5", "0.000030517578125"):
        assert score_coin_flip(coins, honest, tiny) == 1.0, honest
    for wrong in ("0", "0.0", "0.0001", "1/2", "1e999", "nan", "1/0", "9" * 70, "0.00003"):
        assert score_coin_flip(coins, wrong, tiny) == 0.0, wrong
    half = {"answer": "0.3125"}
    assert score_coin_flip(coins, "0.31255", half) == score_coin_flip(coins, "5/16", half) == 1.0
    assert score_coin_flip(coins, "0", half) == score_coin_flip(coins, "0.3", half) == 0.0


def test_credit_pays_the_verdict_or_audited_progress():
    assert credit("rectangle_count", 0.6) == credit("sudoku", 0.9) == 0.0
    assert credit("rectangle_count", 1.0) == 1.0
    assert credit("knight_swap", 0.05) == credit("boxnet", 0.05) == 0.0
    assert credit("knight_swap", 0.5) == credit("shortest_path", 0.5) == 0.5
    assert credit("complex_arithmetic", 0.995) == credit("polynomial_equations", 0.995) == 1.0
    assert credit("complex_arithmetic", 0.98) == 0.0
    assert credit("a_dataset_nobody_audited", 0.99) == 0.0
    assert set(PARTIAL) | set(NEAR) <= set(dataset_names())


def test_composite_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="composite.*not served.*one dataset per env"):
        ReasoningGymEnv({"turn_order": ["reasoner"], "dataset": "composite"})

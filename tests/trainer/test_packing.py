"""trainer_svc.packing.pack: every row in exactly one micro-batch, each within the budget, and the
cut the cheapest there is for the length order (checked against every cut by brute force);
lengths that differ are packed apart where arrival order would pad them together."""

import itertools
import random

import pytest

from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample
from trainer_svc.packing import MICRO_BATCH_OVERHEAD, _length_order, pack, padded_size


def sample(prompt: list[int], response_len: int) -> TrainSample:
    return TrainSample("a", prompt, [7] * response_len, [0.0] * response_len, 1.0, Sampling())


def random_step(seed: int, groups: int = 4, k: int = 3) -> list[TrainSample]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 99)] * rng.randint(5, 60) for _ in range(groups)]
    rows = [sample(p, rng.randint(1, 40)) for p in prompts for _ in range(k)]
    rng.shuffle(rows)
    return rows


def cost(samples, batches, shared):
    return sum(padded_size([samples[r] for r in m], shared) + MICRO_BATCH_OVERHEAD for m in batches)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_every_row_once_within_the_budget_and_no_cut_of_the_order_is_cheaper(seed, shared):
    samples = random_step(seed)
    budget = 300
    batches = pack(range(len(samples)), samples, budget, shared)
    assert sorted(r for m in batches for r in m) == list(range(len(samples)))
    for m in batches:
        assert len(m) == 1 or padded_size([samples[r] for r in m], shared) <= budget
    order = _length_order(range(len(samples)), samples, shared)
    n, cheapest = len(order), float("inf")
    for k in range(n):  # every way to cut the order into consecutive runs (2^11)
        for cuts in itertools.combinations(range(1, n), k):
            runs = [order[a:b] for a, b in zip((0, *cuts), (*cuts, n), strict=True)]
            if all(
                len(m) == 1 or padded_size([samples[r] for r in m], shared) <= budget for m in runs
            ):
                cheapest = min(cheapest, cost(samples, runs, shared))
    assert cost(samples, batches, shared) == cheapest


def test_long_and_short_groups_are_packed_apart():
    """A tool's long programs and a reasoner's short answers, arriving interleaved: packed in
    arrival order they pad each other; packed by length they do not."""
    long_p, short_p = [5] * 100, [6] * 100
    samples = [sample(long_p if i % 2 == 0 else short_p, 80 if i % 2 == 0 else 8) for i in range(8)]
    batches = pack(range(8), samples, 600, shared=True)
    assert sorted(map(sorted, batches)) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    arrival = [[0, 1, 2, 3], [4, 5, 6, 7]]  # what greedy packing in arrival order made of them
    assert cost(samples, batches, True) < cost(samples, arrival, True)


def test_a_row_longer_than_the_budget_is_a_micro_batch_of_its_own():
    samples = [sample([1] * 50, 60), sample([2] * 5, 5), sample([3] * 5, 5)]
    batches = pack(range(3), samples, 100, shared=False)
    assert [0] in batches and sorted(r for m in batches for r in m) == [0, 1, 2]

"""Trajectory-level GRPO advantages (algorithm.grouping: trajectory) on cases worked out by hand.
One value per copy: A_j = (R_j - mean) / (unbiased std + 1e-6) over the group's K copies, every
sample of copy j gets A_j; norm_std=False: R_j - mean; equal returns -> A = 0. Expected numbers are
written literally with the arithmetic beside them."""

import pytest
import torch

from atgrpo.algo.advantages import trajectory_advantages


def run(returns, groups, copies, **kw):
    adv, flat = trajectory_advantages(
        torch.tensor(returns, dtype=torch.double), torch.tensor(groups), torch.tensor(copies), **kw
    )
    return adv.tolist(), flat.tolist()


def test_a_copy_with_more_turns_does_not_weigh_more():
    # Copies' returns [1, 0, 0, 0]; copy 0 has 3 samples (turns), the others 1.
    # Per copy: mean 0.25, dev [0.75, -0.25 x3], SS 0.75, var 0.25, std 0.5;
    # A = 0.75 / 0.500001 = 1.499997000006, -0.25 / 0.500001 = -0.499999000002.
    # (Over samples the mean would be 3/6 = 0.5 instead.)
    adv, flat = run([1, 1, 1, 0, 0, 0], [0] * 6, [0, 0, 0, 1, 2, 3])
    assert adv == pytest.approx([1.499997000006] * 3 + [-0.499999000002] * 3, rel=1e-6)
    assert flat == [False] * 6


def test_norm_std_false_is_return_minus_mean():
    # Returns [2, 1, 0] (copy 1 has two samples): mean 1 -> [1, 0, 0, -1].
    adv, _ = run([2, 1, 1, 0], [0] * 4, [0, 1, 1, 2], norm_std=False)
    assert adv == pytest.approx([1.0, 0.0, 0.0, -1.0], abs=1e-7)


def test_flat_group_gets_zero_and_is_marked():
    # Every copy returned 0.5: no signal, A = 0 exactly (also with norm_std=False).
    for norm_std in (True, False):
        adv, flat = run([0.5, 0.5, 0.5, 0.5], [0] * 4, [0, 0, 1, 2], norm_std=norm_std)
        assert adv == [0.0] * 4
        assert flat == [True] * 4


def test_groups_stay_apart_and_samples_may_interleave():
    # Group 0: copies [1, 0] -> mean 0.5, dev +-0.5, SS 0.5, var 0.5/1, std 0.70710678;
    #   A = +-0.5 / 0.70710778 = +-0.70710578.  Group 1: copies [3, 3] -> flat, 0.
    # Copy index 0 exists in both groups and must not merge across them.
    adv, flat = run([1, 3, 0, 3, 1], [0, 1, 0, 1, 0], [0, 0, 1, 1, 0])
    assert adv == pytest.approx([0.70710578, 0.0, -0.70710578, 0.0, 0.70710578], rel=1e-6)
    assert flat == [False, True, False, True, False]


def test_single_copy_and_empty():
    assert run([2.0, 2.0], [0, 0], [0, 0]) == ([0.0, 0.0], [True, True])
    assert run([], [], []) == ([], [])

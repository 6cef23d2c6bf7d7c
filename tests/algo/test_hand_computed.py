"""AT-GRPO rewards, groups, advantages, branch selection and loss on small cases worked out by hand
(DESIGN.md §1). Every expected number is written literally, with the arithmetic beside it; none is
computed by the code under test. Conventions: r = alpha * team + local; groups (task, agent, turn);
A = (r - mean) / (unbiased std + 1e-6); norm_std=False: A = r - mean; zero-variance -> A = 0."""

import math
from dataclasses import replace

import pytest
import torch

from atgrpo.algo.advantages import group_advantages, leave_one_out_advantages
from atgrpo.algo.loss import policy_loss
from atgrpo.algo.registry import estimate
from atgrpo.contract.rollout import PolicyRef, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig
from rollout_svc.tree import select_branch
from router_svc.steps import step_batches


def one_group(rewards, **kw):
    adv, flat = group_advantages(
        torch.tensor(rewards, dtype=torch.double), torch.zeros(len(rewards), dtype=torch.long), **kw
    )
    return adv.tolist(), flat.tolist()


def sample(task, agent, turn, branch, team, local=0.0, episode=1):
    return Sample(
        task,
        agent,
        turn,
        branch,
        PolicyRef("p"),
        [1],
        [2, 3],
        [-0.1, -0.2],
        team,
        local,
        False,
        False,
        branch == 0,
        Sampling(),
        episode=episode,
    )


def test_binary_success_one_of_four():
    # [1,0,0,0]: mean 0.25; dev [0.75,-0.25,-0.25,-0.25]; SS = 0.5625 + 3*0.0625 = 0.75;
    # var = 0.75/3 = 0.25; std 0.5. A = 0.75/0.500001 = 1.499997, -0.25/0.500001 = -0.499999.
    adv, flat = one_group([1.0, 0.0, 0.0, 0.0])
    assert adv == pytest.approx(
        [1.499997000006, -0.499999000002, -0.499999000002, -0.499999000002], rel=1e-6
    )
    assert flat == [False] * 4


@pytest.mark.parametrize("norm_std", [True, False])
def test_all_equal_nonzero_rewards_give_zero_in_both_modes(norm_std):
    # [0.5]*4: no variance -> A = 0 exactly (not 0/(0+eps) noise), with or without the std.
    adv, flat = one_group([0.5, 0.5, 0.5, 0.5], norm_std=norm_std)
    assert adv == [0.0, 0.0, 0.0, 0.0] and flat == [True] * 4


def test_alpha_half_mixing_exact_values():
    # team [1,1,0,0], local [0,.5,.5,-1].
    # alpha .5: r = [.5, 1, .5, -1]; mean .25; dev [.25,.75,.25,-1.25]; SS = 2.25; var .75; std
    # .8660254
    #   A = [.25,.75,.25,-1.25] / .8660264 = [.2886748, .8660244, .2886748, -1.4433740]
    # alpha 1:  r = [1, 1.5, .5, -1]; mean .5; SS = .25+1+0+2.25 = 3.5; var 7/6; std 1.0801234
    #   A = [.5, 1, 0, -1.5] / 1.0801244 = [.4629096, .9258192, 0, -1.3887289]
    samples = [
        sample("t", "a", 0, i, t, loc)
        for i, (t, loc) in enumerate(zip([1, 1, 0, 0], [0, 0.5, 0.5, -1], strict=True))
    ]
    half = step_batches(samples, {"a": "p"}, alpha=0.5)
    assert half.rewards == pytest.approx([0.5, 1.0, 0.5, -1.0])
    assert half.advantages == pytest.approx(
        [0.2886748013, 0.8660244038, 0.2886748013, -1.4433740063], rel=1e-6
    )
    full = step_batches(samples, {"a": "p"}, alpha=1.0)
    assert full.rewards == pytest.approx([1.0, 1.5, 0.5, -1.0])
    assert full.advantages == pytest.approx(
        [0.4629096213, 0.9258192426, 0.0, -1.3887288639], rel=1e-6, abs=1e-7
    )


def test_two_agents_two_turns_of_one_task_are_separate_groups():
    # One task, interleaved: (a,0) = [1,0] -> +-0.5/(0.7071068+1e-6) = +-0.7071058;
    # (b,0) = [3,5] -> -+1/(1.4142136+1e-6) = -+0.7071063; (a,1) = [2,2] flat -> 0, 0.
    # Pooled into one group [1,3,2,0,5,2] they would be [-0.677,0.484,-0.097,-1.258,1.645,-0.097].
    samples = [
        sample("t", "a", 0, 0, 1),
        sample("t", "b", 0, 0, 3),
        sample("t", "a", 1, 0, 2),
        sample("t", "a", 0, 1, 0),
        sample("t", "b", 0, 1, 5),
        sample("t", "a", 1, 1, 2),
    ]
    out = step_batches(samples, {"a": "p", "b": "q"})
    assert out.advantages == pytest.approx(
        [0.7071057812, -0.7071062812, 0.0, -0.7071057812, 0.7071062812, 0.0], rel=1e-6
    )
    assert (out.agents["a"].groups, out.agents["a"].zero_variance_groups) == (2, 1)
    assert (out.agents["b"].groups, out.agents["b"].zero_variance_groups) == (1, 0)
    kept = step_batches(samples, {"a": "p", "b": "q"}, filter_zero_variance=True)
    assert kept.dropped == 2  # the flat (a, turn 1) pair
    assert [s.advantage for s in kept.per_pool["p"]] == pytest.approx(
        [0.7071057812, -0.7071057812], rel=1e-6
    )
    assert [s.advantage for s in kept.per_pool["q"]] == pytest.approx(
        [-0.7071062812, 0.7071062812], rel=1e-6
    )


def test_dr_grpo_vs_std_normalised_on_the_same_group():
    # [0,1,2,5]: mean 2 -> Dr.GRPO A = [-2,-1,0,3]. SS = 4+1+0+9 = 14; var 14/3; std 2.1602469;
    # normalised A = [-2,-1,0,3] / 2.1602479 = [-0.9258197, -0.4629098, 0, 1.3887295].
    adv, _ = one_group([0.0, 1.0, 2.0, 5.0], norm_std=False)
    assert adv == pytest.approx([-2.0, -1.0, 0.0, 3.0])
    adv, _ = one_group([0.0, 1.0, 2.0, 5.0])
    assert adv == pytest.approx(
        [-0.9258196712, -0.4629098356, 0.0, 1.3887295068], rel=1e-6, abs=1e-7
    )


def test_epsilon_is_added_to_the_std_not_the_variance():
    # [0, 1e-3]: mean 5e-4; SS = 2 * 2.5e-7 = 5e-7 (n-1 = 1); std 7.0710678e-4.
    # A = +-5e-4 / (7.0710678e-4 + 1e-6) = +-0.7061082 (not 0.7071068: eps is visible at this scale;
    # eps inside the sqrt would give 5e-4/sqrt(5e-7+1e-6) = 0.4082).
    adv, flat = one_group([0.0, 1e-3])
    assert adv == pytest.approx([-0.7061081934, 0.7061081934], rel=1e-6)
    assert flat == [False, False]


@pytest.mark.parametrize("norm_std", [True, False])
def test_singleton_group_gets_zero_and_is_filtered(norm_std):
    # One sample: no variance (the unbiased std is undefined) -> A = 0, counted as zero-variance and
    # dropped by the DAPO filter. (The reference's "raw reward when every group is a singleton"
    # exception is not part of DESIGN.md.)
    adv, flat = one_group([3.0], norm_std=norm_std)
    assert adv == [0.0] and flat == [True]
    out = step_batches(
        [sample("t", "a", 0, 0, 3.0)], {"a": "p"}, norm_std=norm_std, filter_zero_variance=True
    )
    assert out.dropped == 1 and out.per_pool == {}


def test_negative_rewards():
    # [-1,-2,-3,-6]: mean -3; dev [2,1,0,-3]; SS 14; std 2.1602469 -> [0.9258197, 0.4629098, 0,
    # -1.3887295]
    adv, _ = one_group([-1.0, -2.0, -3.0, -6.0])
    assert adv == pytest.approx(
        [0.9258196712, 0.4629098356, 0.0, -1.3887295068], rel=1e-6, abs=1e-7
    )


def test_turn_two_only_where_the_episode_went_on():
    # Task t: turn 0 rewards [0,1,1] -> the kept branch is 1 (tie 1 == 1 -> lowest index); turn 1 is
    # sampled K=3 times from that branch: [2,0,1]. Task u ends at turn 0 with [1,0,0].
    # t/0: mean 2/3; SS = 4/9+1/9+1/9 = 2/3; var 1/3; std 0.5773503 -> [-1.1546985, 0.5773492,
    # 0.5773492] t/1: mean 1; std 1 -> [1, -1, 0] / 1.000001 = [0.999999, -0.999999, 0] u/0: the
    # mirror of t/0 -> [1.1546985, -0.5773492, -0.5773492]
    assert select_branch([0.0, 1.0, 1.0], "best") == 1
    samples = (
        [sample("t", "a", 0, i, r) for i, r in enumerate([0, 1, 1])]
        + [sample("t", "a", 1, i, r) for i, r in enumerate([2, 0, 1])]
        + [sample("u", "a", 0, i, r) for i, r in enumerate([1, 0, 0])]
    )
    out = step_batches(samples, {"a": "p"})
    assert out.advantages == pytest.approx(
        [
            -1.1546984911,
            0.5773492455,
            0.5773492455,
            0.999999,
            -0.999999,
            0.0,
            1.1546984911,
            -0.5773492455,
            -0.5773492455,
        ],
        rel=1e-6,
        abs=1e-7,
    )
    assert out.agents["a"].groups == 3


def test_selection_uses_the_mixed_reward():
    # team [1,0], local [0,0.8]: alpha .5 -> r = [.5,.8] -> branch 1; alpha 1 -> [1,.8] -> branch 0.
    team, local = [1.0, 0.0], [0.0, 0.8]
    assert select_branch([0.5 * t + loc for t, loc in zip(team, local, strict=True)], "best") == 1
    assert select_branch([1.0 * t + loc for t, loc in zip(team, local, strict=True)], "best") == 0
    assert select_branch([0.5, 1.0, 1.0, -1.0], "best") == 1  # tie -> lowest index
    assert select_branch([0.0, 5.0], "first") == 0


def test_two_episodes_of_one_task_in_a_step_are_not_pooled():
    # A finite task list walked in per-epoch permutations repeats a task within one step when the
    # step straddles an epoch boundary (or tasks_per_step > the list), so one step can hold two
    # episodes of task "t". Each is its own tree: episode 1's (a, turn 0) = [1, 0], episode 2's =
    # [1, 1]. Right: E1 -> +-0.5/0.7071078 = +-0.7071058; E2 flat -> 0, 0. Pooled (the bug):
    # [1,0,1,1], mean .75, std .5 -> [0.499999, -1.499997, 0.499999, 0.499999].
    samples = [
        sample("t", "a", 0, 0, 1, episode=1),
        sample("t", "a", 0, 1, 0, episode=1),
        sample("t", "a", 0, 0, 1, episode=2),
        sample("t", "a", 0, 1, 1, episode=2),
    ]
    out = step_batches(samples, {"a": "p"})
    assert out.advantages == pytest.approx([0.7071057812, -0.7071057812, 0.0, 0.0], rel=1e-6)
    assert (out.agents["a"].groups, out.agents["a"].zero_variance_groups) == (2, 1)
    assert step_batches(samples, {"a": "p"}, filter_zero_variance=True).dropped == 2


def test_leave_one_out_baseline_is_the_mean_of_the_other_branches():
    # One group [1, 0, 0, 0] (K = 4): baselines (0+0+0)/3 = 0 and (1+0+0)/3 = 1/3, so
    # A = 1 - 0 = 1 and 0 - 1/3 = -0.3333333 (= 4/3 * (r - 0.25)); with norm_std divided by
    # the group's unbiased std 0.5 (+1e-6): 1/0.500001 = 1.999996, -0.3333333/0.500001 = -0.6666653.
    # A second group [2, 2] is flat -> 0; a singleton [5] has no others -> 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 5.0], dtype=torch.double)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv, flat = leave_one_out_advantages(rewards, groups, norm_std=False)
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0], abs=1e-7)
    assert flat.tolist() == [False] * 4 + [True] * 3
    adv, _ = leave_one_out_advantages(rewards, groups, norm_std=True)
    assert adv.tolist()[:2] == pytest.approx([1.999996, -0.6666653], rel=1e-6)


def test_the_grouping_ablation_keys_on_one_tree():
    # One task, agents a and b, turns 0 and 1, K = 2; rewards r = 0..7 in the order
    # (a,0,b0) (a,0,b1) (a,1,b0) (a,1,b1) (b,0,b0) (b,0,b1) (b,1,b0) (b,1,b1); norm_std off.
    #   turn (task, agent, turn): pairs [0,1] [2,3] [4,5] [6,7] -> -0.5, +0.5 each
    #   turn_loo: the other branch is the baseline -> -1, +1 each
    #   task_agent: a = [0..3] mean 1.5, b = [4..7] mean 5.5 -> -1.5 -0.5 0.5 1.5 twice
    #   task_turn: turn 0 = [0,1,4,5] mean 2.5, turn 1 = [2,3,6,7] mean 4.5
    #   task: all eight, mean 3.5 -> r - 3.5
    samples = [sample("t", a, u, b, 0.0) for a in "ab" for u in (0, 1) for b in (0, 1)]
    r = torch.arange(8, dtype=torch.double)
    expected = {
        "turn": [-0.5, 0.5] * 4,
        "turn_loo": [-1.0, 1.0] * 4,
        "task_agent": [-1.5, -0.5, 0.5, 1.5] * 2,
        "task_turn": [-2.5, -1.5, -2.5, -1.5, 1.5, 2.5, 1.5, 2.5],
        "task": [-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5],
    }
    for name, want in expected.items():
        got = estimate(name, samples, r, norm_std=False)
        assert got.advantages.tolist() == pytest.approx(want), name
    assert estimate("task", samples, r, norm_std=False).groups.tolist() == [0] * 8
    # a second run of the task (episode 2) is its own group under every key
    twice = samples + [replace(x, episode=2) for x in samples]
    assert estimate("task", twice, torch.cat([r, r]), norm_std=False).groups.tolist() == (
        [0] * 8 + [1] * 8
    )


@pytest.mark.parametrize("grouping", ["turn", "trajectory", "turn_loo", "task", "task_turn"])
def test_a_sample_that_names_no_episode_is_refused(grouping):
    # Without its episode a sample's group is a guess: two runs of one task would share it.
    samples = [sample("t", "a", 0, 0, 1), sample("t", "a", 0, 1, 0, episode=0)]
    with pytest.raises(ValueError, match="task 't' .* has episode 0: number each task"):
        step_batches(samples, {"a": "p"}, grouping=grouping)


# ---- the loss: 2 sequences x 2 tokens ----------------------------------------------------------
# A = [1, -2]; old = [[-1,-1],[-2,-2]]; new = [[-0.9,-1.5],[-0.5,-2+ln 1.5]]
# ratios [[e^0.1, e^-0.5], [e^1.5, 1.5]] = [[1.1051709, 0.6065307], [4.4816891, 1.5]]
# per token max(-A r, -A clip(r, 0.8, 1.2)), then for A < 0 min(., -A c), c = 3:
#   seq 1 (A=1):  max(-1.1051709, -1.1051709) = -1.1051709;  max(-0.6065307, -0.8) = -0.6065307
#   seq 2 (A=-2): max(8.9633781, 2.4) = 8.9633781 -> min(., 6) = 6;  max(3.0, 2.4) = 3.0
A2 = torch.tensor([1.0, -2.0])
OLD2 = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
NEW2 = [[-0.9, -1.5], [-0.5, -2.0 + math.log(1.5)]]


def test_loss_token_mean_and_per_token_gradients():
    # token-mean = (-1.1051709 - 0.6065307 + 6 + 3) / 4 = 1.8220746
    # d loss / d logprob = -A r / 4 where the unclipped term is active, 0 where clipped:
    # [[-1.1051709/4, -0.6065307/4], [0 (dual clip), 2*1.5/4]] = [[-0.2762927, -0.1516327], [0,
    # 0.75]]
    new = torch.tensor(NEW2, requires_grad=True)
    loss, m = policy_loss(new, OLD2, A2, torch.ones(2, 2), LossConfig())
    assert loss.item() == pytest.approx(1.8220746056, rel=1e-6)
    loss.backward()
    assert new.grad.flatten().tolist() == pytest.approx(
        [-0.2762927295, -0.1516326649, 0.0, 0.75], rel=1e-6, abs=1e-7
    )


def test_loss_masked_is_token_mean_not_sequence_mean():
    # mask [[1,0],[1,1]]: token-mean = (-1.1051709 + 6 + 3) / 3 = 2.6316097;
    # a mean of per-sequence means would be (-1.1051709 + 9/2) / 2 = 1.6974145.
    loss, _ = policy_loss(
        torch.tensor(NEW2), OLD2, A2, torch.tensor([[1, 0], [1, 1]]), LossConfig()
    )
    assert loss.item() == pytest.approx(2.6316096940, rel=1e-6)


def test_loss_with_k3_kl_to_the_reference():
    # ref - new = [[0, .5], [-.5, 0]]; k3 = e^d - d - 1 = [[0, 0.1487213], [0.1065307, 0]]; mean
    # 0.0638130 loss = 1.8220746 + 0.1 * 0.0638130 = 1.8284559
    new = torch.tensor(NEW2)
    ref = new + torch.tensor([[0.0, 0.5], [-0.5, 0.0]])
    loss, m = policy_loss(
        new, OLD2, A2, torch.ones(2, 2), LossConfig(kl_coef=0.1), ref_logprobs=ref
    )
    assert m["kl_ref"] == pytest.approx(0.0638129826, rel=1e-5)
    assert loss.item() == pytest.approx(1.8284559038, rel=1e-6)

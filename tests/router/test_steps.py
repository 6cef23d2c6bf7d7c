"""The router's step logic: resumable task choice, and samples -> per-pool training batches."""

import random

import pytest

from atgrpo.contract.rollout import EpisodeEnd, PolicyRef, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.sdk.env import EVAL_SEED_OFFSET
from router_svc.steps import episode_metrics, step_batches, step_tasks


def sample(task, agent, turn, branch, team, local=0.0, episode=1):
    return Sample(
        task,
        agent,
        turn,
        branch,
        PolicyRef("p"),
        [1, 2],
        [3, 4],
        [-0.1, -0.2],
        team,
        local,
        False,
        False,
        branch == 0,
        Sampling(),
        episode=episode,
    )


def test_generated_tasks_are_a_pure_function_of_seed_and_step():
    a = step_tasks(7, 3, 4)
    assert a == step_tasks(7, 3, 4)  # a resumed run draws the same tasks
    assert not {t.task_id for t in a} & {t.task_id for t in step_tasks(7, 4, 4)}  # never repeated
    assert not {t.seed for t in a} & {t.seed for t in step_tasks(8, 3, 4)}  # runs differ
    ev = step_tasks(7, 0, 2, split="eval")
    assert all(t.seed >= EVAL_SEED_OFFSET and t.split == "eval" for t in ev)


def test_finite_task_lists_are_walked_in_seeded_epochs():
    ids = [f"q{i}" for i in range(5)]
    first_epoch = [t.task_id for s in range(5) for t in step_tasks(1, s, 1, task_ids=ids)]
    assert sorted(first_epoch) == ids  # each task once per epoch
    assert [t.task_id for t in step_tasks(1, 2, 3, task_ids=ids)] == [
        t.task_id for t in step_tasks(1, 2, 3, task_ids=ids)
    ]
    with pytest.raises(ValueError, match="no tasks"):
        step_tasks(1, 0, 1, task_ids=[])


def test_groups_are_per_task_agent_turn_and_routed_by_pool():
    samples = [
        *(sample("t0", "tool", 0, b, r) for b, r in enumerate([0.0, 1.0])),  # group with variance
        *(sample("t0", "plan", 0, b, 0.5) for b in range(2)),  # flat group
        # another task: own group
        *(sample("t1", "tool", 0, b, r) for b, r in enumerate([2.0, 0.0])),
    ]
    out = step_batches(samples, {"tool": "A", "plan": "B"}, alpha=1.0)
    assert [s.advantage for s in out.per_pool["A"]] == pytest.approx(
        [-0.7071064, 0.7071064, 0.7071064, -0.7071064]
    )
    assert [s.advantage for s in out.per_pool["B"]] == [0.0, 0.0]
    assert out.agents["tool"].groups == 2 and out.agents["plan"].zero_variance_groups == 1
    filtered = step_batches(samples, {"tool": "A", "plan": "B"}, filter_zero_variance=True)
    assert "B" not in filtered.per_pool and filtered.dropped == 2
    assert all(s.agent == "tool" for s in filtered.per_pool["A"])


def test_alpha_mixes_team_and_local_before_grouping():
    samples = [sample("t", "a", 0, 0, 1.0, 0.0), sample("t", "a", 0, 1, 0.0, 0.5)]
    pos = step_batches(samples, {"a": "p"}, alpha=1.0).per_pool["p"]  # r = 1.0 vs 0.5
    neg = step_batches(samples, {"a": "p"}, alpha=0.25).per_pool["p"]  # r = 0.25 vs 0.5
    assert pos[0].advantage > 0 > pos[1].advantage
    assert neg[0].advantage < 0 < neg[1].advantage


def test_episode_metrics_count_failures_apart():
    ends = [
        EpisodeEnd("a", True, 2, {}),
        EpisodeEnd("b", False, 4, {}),
        EpisodeEnd("c", False, 0, {}, error="x"),
    ]
    assert episode_metrics(ends) == {
        "episodes": 2.0,
        "failed_episodes": 1.0,
        "success_rate": 0.5,
        "turns_mean": 3.0,
    }


def test_cut_prompts_and_responses_are_counted_and_shown():
    from atgrpo.cli.report import step_line
    from atgrpo.contract import run_wire
    from router_svc import events

    samples = [sample("t", "a", 0, b, 1.0 * b) for b in range(4)]
    samples[0].prompt_truncated = samples[1].response_truncated = samples[2].response_truncated = (
        True
    )
    e = events.step_event(1, step_batches(samples, {"a": "p"}), [], {}, {})
    assert e["agents"]["a"]["prompt_truncated_fraction"] == 0.25
    assert e["agents"]["a"]["response_truncated_fraction"] == 0.5
    assert (
        run_wire.event_from_pb(
            run_wire.event_to_pb(
                "r", {**e, "rollout_seconds": 0.0, "train_seconds": 0.0, "weight_sync_seconds": 0.0}
            )
        )["agents"]["a"]
        == e["agents"]["a"]
    )
    assert step_line(e, 10).endswith("| prompts cut: a 25%")


def test_trajectory_groups_are_per_task_agent_episode_over_copies():
    # Task t0 ran twice in the step (two episodes, K = 2 copies each, emitted one after another).
    # Episode 1: copy 0 has two turns with return 1.0, copy 1 one turn with 0.0; episode 2: returns
    # 0.0 and 2.0 (own group). norm_std off: A = R - mean over the copies, one value per copy:
    # episode 1 mean 0.5 -> copy 0 +0.5 (both its samples), copy 1 -0.5 (not -1/3 over samples);
    # episode 2 mean 1.0 -> -1.0, +1.0.
    samples = [
        sample("t0", "tool", 0, 0, 1.0, episode=1),
        sample("t0", "tool", 1, 0, 1.0, episode=1),
        sample("t0", "tool", 0, 1, 0.0, episode=1),
        sample("t0", "tool", 0, 0, 0.0, episode=2),
        sample("t0", "tool", 0, 1, 2.0, episode=2),
    ]
    out = step_batches(samples, {"tool": "p"}, norm_std=False, grouping="trajectory")
    assert out.advantages == pytest.approx([0.5, 0.5, -0.5, -1.0, 1.0])
    assert out.agents["tool"].groups == 2
    # The default (turn) grouping of the same samples is unchanged: episode 1's turn 1 is a group
    # alone.
    turn = step_batches(samples, {"tool": "p"}, norm_std=False)
    assert (
        turn.advantages == pytest.approx([0.5, 0.0, -0.5, -1.0, 1.0])
        and turn.agents["tool"].groups == 3
    )


@pytest.mark.parametrize("grouping", ["turn", "trajectory"])
def test_shuffled_samples_give_the_same_groups_and_advantages(grouping):
    # t0 ran twice (episodes 1 and 3) and t1 once (episode 2), two agents, K = 3, up to two turns:
    # with each sample naming its episode, the order the samples arrive in changes nothing.
    rng = random.Random(0)
    samples = [
        sample(task, agent, turn, b, rng.choice([0.0, 1.0, 2.0]), rng.random(), episode=ep)
        for task, ep, turns in (("t0", 1, 2), ("t1", 2, 1), ("t0", 3, 2))
        for turn in range(turns)
        for agent in ("a", "b")
        for b in range(3)
    ]
    pool_of = {"a": "p", "b": "q"}
    base = step_batches(samples, pool_of, grouping=grouping)
    for seed in range(5):
        order = list(range(len(samples)))
        random.Random(seed).shuffle(order)
        got = step_batches([samples[i] for i in order], pool_of, grouping=grouping)
        assert [got.advantages[order.index(i)] for i in range(len(samples))] == pytest.approx(
            base.advantages
        )
        assert {a: s.groups for a, s in got.agents.items()} == {
            a: s.groups for a, s in base.agents.items()
        }
    # Episodes 1 and 3 of t0 are separate groups: (2 + 1 + 2 turns) x 2 agents per-turn groups,
    # or 3 runs x 2 agents over the trajectory.
    assert sum(s.groups for s in base.agents.values()) == (10 if grouping == "turn" else 6)


def test_collect_plans_number_their_episodes_and_the_wire_keeps_them(tmp_path):
    from atgrpo.contract.rollout import TaskRef
    from atgrpo.contract.rollout_wire import collect_plan_from_pb, collect_plan_to_pb
    from router_svc.steps import collect_plan
    from tests.router.test_run_pieces import config

    plan = collect_plan(
        config(tmp_path), [TaskRef("x", 1), TaskRef("y", 2), TaskRef("x", 1)], step=1
    )
    assert [(t.task_id, t.episode) for t in plan.tasks] == [("x", 1), ("y", 2), ("x", 3)]
    assert collect_plan_from_pb(collect_plan_to_pb(plan)).tasks == plan.tasks

"""router_svc.dispatch and router_svc.fleet: the rules, pinned with scripted replicas (fakes,
named so: each streams what the test says). tests/e2e/test_elastic.py runs the real processes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from atgrpo.contract.rollout import CollectPlan, EpisodeEnd, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.errors import FailedPrecondition, Unavailable
from router_svc.dispatch import Dispatch, chunk_size
from router_svc.fleet import Fleet
from router_svc.steps import step_tasks


def plan(n: int) -> CollectPlan:
    tasks = tuple(replace(t, episode=i) for i, t in enumerate(step_tasks(0, 0, n), 1))
    return CollectPlan(env="toy", tasks=tasks, agents={}, turn_order=("a",), max_turns=1, step=1)


def sample(task) -> Sample:
    return Sample(
        task_id=task.task_id,
        agent="a",
        turn=0,
        branch=0,
        policy=None,
        prompt_ids=[1],
        response_ids=[2],
        logprobs=[-0.1],
        team_reward=1.0,
        local_reward=0.0,
        done=True,
        success=True,
        selected=True,
        sampling=Sampling(),
        episode=task.episode,
    )


class ScriptedReplicas:
    """Fake replicas: each task yields two samples then its end. A replica in `dies_after` breaks
    off (UNAVAILABLE) after that many episode ends across its streams; `calls` records
    (replica, task ids) per stream."""

    def __init__(self, dies_after: dict[str, int] | None = None, error=Unavailable):
        self.dies_after = dict(dies_after or {})
        self.error = error
        self.calls: list[tuple[str, list[str]]] = []
        self.ended: dict[str, int] = {}

    async def __call__(self, address: str, part: CollectPlan):
        self.calls.append((address, [t.task_id for t in part.tasks]))
        for task in part.tasks:
            await asyncio.sleep(0)
            yield sample(task)
            if self.ended.get(address, 0) >= self.dies_after.get(address, 1 << 30):
                raise self.error(f"{address} is gone")  # mid-episode: a sample already sent
            yield sample(task)
            self.ended[address] = self.ended.get(address, 0) + 1
            last = task is part.tasks[-1]  # a Collect's last end says where its time went
            yield EpisodeEnd(
                task.task_id, True, 1, {"a": 1.0}, timing={"collect_s": 1.0} if last else {}
            )


def run(coro):
    return asyncio.run(coro)


def test_an_even_fleet_gets_today_s_even_split():
    replicas = ScriptedReplicas()
    d = Dispatch(plan(8), {"p": ["r0", "r1"]}, replicas)
    samples, ends = run(d.run())
    assert len(ends) == 8 and len(samples) == 16 and d.requeued == 0
    per = {a: sum(n for r, n in d.chunks if r == a) for a in ("r0", "r1")}
    assert per == {"r0": 4, "r1": 4}
    # guided self-scheduling: big chunks first, never more than a replica's share in flight
    assert [n for _, n in d.chunks] == [2, 2, 1, 1, 1, 1]
    # each Collect's timing names its replica, so a step adds up the Collects a model served
    timed = sorted(e.timing["replica"] for e in ends if e.timing)
    assert timed == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


def test_chunks_shrink_with_the_queue():
    assert [chunk_size(q, 2) for q in (8, 6, 4, 3, 1, 0)] == [2, 2, 1, 1, 1, 1]


def test_a_lost_replica_s_unfinished_tasks_are_collected_elsewhere_exactly_once():
    replicas = ScriptedReplicas(dies_after={"r1": 1})
    lost: list[str] = []
    d = Dispatch(plan(8), {"p": ["r0", "r1"]}, replicas, lost.append)
    samples, ends = run(d.run())
    assert lost == ["r1"]
    assert sorted(e.task_id for e in ends) == sorted(t.task_id for t in plan(8).tasks)
    # every task kept from one complete episode: two samples each, none of the broken one's
    assert len(samples) == 16
    assert sorted({(s.task_id, s.episode) for s in samples}) == sorted(
        (t.task_id, t.episode) for t in plan(8).tasks
    )
    assert d.requeued == 3  # r1 held 4, finished 1
    first_round = 6  # chunks [2, 2, 1, 1, 1, 1] before anything ended
    assert replicas.calls[first_round:] and {a for a, _ in replicas.calls[first_round:]} == {"r0"}


def test_every_replica_lost_is_unavailable_and_other_errors_fail_at_once():
    with pytest.raises(Unavailable, match="every rollout replica was lost"):
        run(Dispatch(plan(4), {"p": ["r0"]}, ScriptedReplicas(dies_after={"r0": 1})).run())
    refused = ScriptedReplicas(dies_after={"r0": 0}, error=FailedPrecondition)
    with pytest.raises(FailedPrecondition):
        run(Dispatch(plan(4), {"p": ["r0", "r1"]}, refused).run())
    with pytest.raises(Unavailable, match="no rollout replica"):
        Dispatch(plan(4), {"p": []}, ScriptedReplicas())


def test_a_task_twice_in_one_step_is_told_apart_by_its_episode():
    p = plan(2)
    twice = replace(p, tasks=(p.tasks[0], replace(p.tasks[0], episode=2)))
    samples, ends = run(Dispatch(twice, {"p": ["r0"]}, ScriptedReplicas()).run())
    assert len(ends) == 2 and sorted(s.episode for s in samples) == [1, 1, 2, 2]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_fleet_syncs_joiners_through_the_trainer_and_drops_those_that_left(tmp_path):
    listing = tmp_path / "p.txt"
    listing.write_text("r0:1\n")
    clock = Clock()
    fleet = Fleet({"p": [f"file://{listing}"]}, ["p"], clock=clock, wait_s=0)
    asked: list[list[str]] = []

    async def sync(pool, listed):  # the trainer: every listed replica but "dead" takes weights
        asked.append(listed)
        await asyncio.sleep(0.01)
        return [a for a in listed if not a.startswith("dead")]

    async def scenario():
        assert await fleet.refresh(sync) == {"p": ["r0:1"]}  # none ready yet: waited for
        assert await fleet.refresh(sync) == {"p": ["r0:1"]} and len(asked) == 1  # nothing new
        listing.write_text("r0:1\nr1:1\ndead:1\n")
        # joiners are synced beside the step, which goes on with the replicas ready now
        assert await fleet.refresh(sync) == {"p": ["r0:1"]}
        await asyncio.sleep(0.05)
        assert asked[-1] == ["r0:1", "r1:1", "dead:1"]
        assert await fleet.refresh(sync) == {"p": ["r0:1", "r1:1"]}
        assert len(asked) == 2  # the one the trainer could not sync is retried after retry_s
        clock.now += 5.0
        await fleet.refresh(sync)
        await asyncio.sleep(0.05)
        assert len(asked) == 3
        fleet.lost("r1:1")  # broke off a Collect: no work until synced again
        assert fleet.ready["p"] == ["r0:1"]
        listing.write_text("r1:1\n")  # r0 scaled down, r1 back: none ready, so waited for
        assert await fleet.refresh(sync) == {"p": ["r1:1"]}
        listing.write_text("")
        with pytest.raises(Unavailable, match="atgrpo scale"):
            await fleet.refresh(sync)

    run(scenario())


def test_a_sync_that_fails_beside_a_step_fails_the_next_collection(tmp_path):
    listing = tmp_path / "p.txt"
    listing.write_text("r0:1\n")
    fleet = Fleet({"p": [f"file://{listing}"]}, ["p"])

    async def sync(pool, listed):
        if len(listed) > 1:
            raise FailedPrecondition("the trainer restarted")
        return listed

    async def scenario():
        await fleet.refresh(sync)
        listing.write_text("r0:1\nr1:1\n")
        assert await fleet.refresh(sync) == {"p": ["r0:1"]}
        await asyncio.sleep(0.01)
        with pytest.raises(FailedPrecondition, match="restarted"):
            await fleet.refresh(sync)

    run(scenario())


def test_a_frozen_pool_uses_what_is_listed_and_rests_a_lost_replica(tmp_path):
    clock = Clock()
    fleet = Fleet({"f": ["f0:1", "f1:1"]}, [], clock=clock)

    async def sync(pool, listed):
        raise AssertionError("a frozen pool has no trainer to sync")

    assert run(fleet.refresh(sync)) == {"f": ["f0:1", "f1:1"]}
    fleet.lost("f1:1")
    assert run(fleet.refresh(sync)) == {"f": ["f0:1"]}
    clock.now += 5.0
    assert run(fleet.refresh(sync)) == {"f": ["f0:1", "f1:1"]}

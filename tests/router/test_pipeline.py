"""The asynchronous pipeline's rules (router_svc/pipeline.py), pinned with a scripted loop: a
ScriptedLoop stands in for the RunLoop's services (collection returns made-up samples tagged
with the version a scripted replica serves; training bumps a version), so the order of
collections and updates, and what is dropped as too stale, are predictable. The real services
run the same pipeline in tests/e2e/test_async.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from atgrpo.config import parse_config
from atgrpo.contract.rollout import EpisodeEnd, PolicyRef, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainResult
from router_svc.ledger import Ledger
from router_svc.outcome import TIMING
from router_svc.pipeline import Pipeline
from router_svc.steps import step_tasks

K = 2


def config(max_staleness: int, steps: int):
    return parse_config(
        {
            "run": {
                "name": "pipe",
                "steps": steps,
                "tasks_per_step": 2,
                "eval_every_steps": 0,
                "checkpoint_every_steps": 0,
                "run_dir": "/tmp/unused",
            },
            "env": {"name": "toy", "turn_order": ["speaker"], "max_turns": 1},
            "pools": {"a": {"model_path": "/models/tiny"}},
            "agents": {"speaker": {"pool": "a"}},
            "algorithm": {"k": K, "max_staleness": max_staleness},
        }
    )


class ScriptedTrainer:
    """Trains instantly after `delay`, bumps the version and has the replica serve it."""

    def __init__(self, loop: ScriptedLoop):
        self.loop, self.trained = loop, {}

    async def train(self, run_id, step, expected_version, samples, update):
        await self.loop.before_train(step)
        await asyncio.sleep(self.loop.train_delay)
        self.trained[step] = (
            expected_version,
            sorted({s.policy_version for s in samples}),
            update.max_staleness,
        )
        self.loop.served += 1
        self.loop.log.append(("trained", step))
        return TrainResult(
            run_id,
            step,
            expected_version + 1,
            dict.fromkeys(
                (
                    "loss",
                    "approx_kl",
                    "clip_fraction",
                    "grad_norm",
                    "entropy",
                    "push_seconds",
                    "train_seconds",
                    "staleness_mean",
                    *TIMING,
                ),
                0.0,
            ),
            {"speaker": {"samples": float(len(samples))}},
        )


class LoggedLedger(Ledger):
    """The real Ledger (the real order of a step's two records), its writes logged, not made."""

    def __init__(self, log):
        super().__init__("r", None)
        self.versions = {"a": 0}
        self.log, self.events, self.progress = log, [], []

    def write_progress(self, versions=None):
        self.progress.append((self.completed, dict(versions or self.versions)))
        self.log.append(("progress", self.completed))

    def record(self, event):
        self.events.append(event)
        self.log.append(("event", event["step"]))


class ScriptedLoop:
    """What Pipeline uses of a RunLoop, with collection and training scripted."""

    def __init__(self, cfg, train_delay=0.02, collect_delay=0.01):
        self.cfg = cfg
        self.stop_requested = asyncio.Event()
        self.clients = SimpleNamespace(trainers={"a": ScriptedTrainer(self)})
        self.train_delay, self.collect_delay = train_delay, collect_delay
        self.served = 0  # the version the scripted replica serves
        self.pinned: list[tuple[PolicyRef, ...]] = []  # each collection's expected versions
        # step -> a version served to that step's first collection
        self.serve_once: dict[int, int] = {}
        self.log: list[tuple[str, int]] = []
        self.ledger = LoggedLedger(self.log)
        self.events, self.progress = self.ledger.events, self.ledger.progress

    async def before_train(self, step: int) -> None:
        pass

    async def tasks(self, split, index, count, **_):
        return step_tasks(0, index, count, split)

    async def collect(self, plan):
        self.log.append(("collect", plan.step))
        self.pinned.append(plan.expected_versions)
        version = self.serve_once.pop(plan.step, self.served)
        await asyncio.sleep(self.collect_delay)
        samples = [
            Sample(
                t.task_id,
                "speaker",
                0,
                b,
                PolicyRef("a", "", version),
                [1, 2],
                [3],
                [-0.5],
                float(b),
                0.0,
                True,
                bool(b),
                b == 0,
                Sampling(),
                episode=t.episode,
            )
            for t in plan.tasks
            for b in range(K)
        ]
        self.log.append(("collected", plan.step))
        return samples, [EpisodeEnd(t.task_id, True, 1, {"speaker": 1.0}) for t in plan.tasks]


def order(log, what, step) -> int:
    return log.index((what, step))


def test_without_staleness_a_step_is_collected_after_the_last_trained_and_pinned_to_it():
    loop = ScriptedLoop(config(0, steps=4))
    asyncio.run(Pipeline(loop).run(4))
    # one step after the other: s+1 is collected once s has trained
    assert [x for x in loop.log if x[0] in ("collect", "trained")] == [
        (what, s) for s in range(1, 5) for what in ("collect", "trained")
    ]
    assert [e["step"] for e in loop.events] == [1, 2, 3, 4]
    # every replica must serve the version the trainer holds when the step starts
    assert loop.pinned == [(PolicyRef("a", "", v),) for v in range(4)]
    # step -> (the version it was trained at, the versions its samples came from, N)
    assert loop.clients.trainers["a"].trained == {s: (s - 1, [s - 1], 0) for s in range(1, 5)}


def test_collection_of_step_s_waits_only_for_step_s_minus_1_minus_n():
    loop = ScriptedLoop(config(1, steps=5))
    asyncio.run(Pipeline(loop).run(5))
    log = loop.log
    for s in range(3, 6):  # never more than one version ahead: s starts after s-2 trained
        assert order(log, "trained", s - 2) < order(log, "collect", s)
    # and it does run ahead: step s is collected while s-1 trains
    assert any(order(log, "collect", s) < order(log, "trained", s - 1) for s in range(2, 6))
    assert [e["step"] for e in loop.events] == [1, 2, 3, 4, 5]
    assert [e["pools"]["a"]["version"] for e in loop.events] == [1, 2, 3, 4, 5]
    assert loop.progress[-1] == (5, {"a": 5})
    # each step's event is recorded before state.json counts it (a kill between loses nothing)
    assert all(order(log, "event", s) < order(log, "progress", s) for s in range(1, 6))
    trained = loop.clients.trainers["a"].trained
    assert all(
        pool_version - max(versions) <= 1 and n == 1
        for pool_version, versions, n in trained.values()
    )
    assert any(pool_version - min(versions) == 1 for pool_version, versions, _ in trained.values())


def test_max_staleness_0_in_the_pipeline_is_the_synchronous_order():
    loop = ScriptedLoop(config(0, steps=4))
    asyncio.run(Pipeline(loop).run(4))
    work = [x for x in loop.log if x[0] in ("collect", "collected", "trained")]
    assert work == [
        x for s in range(1, 5) for x in (("collect", s), ("collected", s), ("trained", s))
    ]


def test_a_sample_too_stale_by_its_update_is_dropped_and_its_task_collected_again():
    """Step 3's first collection gets version 0 from a lagging replica while the pool is at 1 (one
    behind: accepted then); the pool trains step 2 before step 3, and at version 2 those samples
    are two behind: dropped, counted, collected again from the replica at version 2."""
    loop = ScriptedLoop(config(1, steps=3))
    loop.serve_once[3] = 0
    collected_3 = asyncio.Event()

    async def before_train(step):
        if step == 2:
            await collected_3.wait()  # step 3 is in before step 2 trains

    loop.before_train = before_train
    original = loop.collect

    async def collect(plan):
        got = await original(plan)
        if plan.step == 3:
            collected_3.set()
        return got

    loop.collect = collect
    asyncio.run(Pipeline(loop).run(3))
    assert loop.log.count(("collect", 3)) == 2  # once more, for the dropped tasks
    step3 = loop.events[2]
    assert step3["pools"]["a"]["dropped_stale"] == 2 * K  # both tasks' K samples
    assert loop.clients.trainers["a"].trained[3] == (2, [2], 1)  # trained only fresh samples
    assert [e["step"] for e in loop.events] == [1, 2, 3]


def test_a_stop_trains_and_records_what_was_collected():
    loop = ScriptedLoop(config(1, steps=10))

    async def before_train(step):
        if step == 2:
            loop.stop_requested.set()

    loop.before_train = before_train
    asyncio.run(Pipeline(loop).run(10))
    collected = sorted({s for what, s in loop.log if what == "collected"})
    # every collected step trained and recorded
    assert [e["step"] for e in loop.events] == collected
    assert len(collected) < 10 and loop.ledger.completed == collected[-1]

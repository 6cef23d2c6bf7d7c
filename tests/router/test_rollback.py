"""A rollback to the last checkpoint is said, not silent: the router records why (metrics.jsonl,
WatchRun, its metrics), and a watcher that held the undone steps is sent them again."""

import asyncio
from types import SimpleNamespace

import pytest

from atgrpo.contract import run_wire
from atgrpo.contract.trainer import TrainerInfo
from atgrpo.errors import Unavailable
from atgrpo.rundir import Checkpoint, Progress, RunDir
from atgrpo.sdk.env import EnvSpec
from router_svc import events
from router_svc.fleet import Fleet
from router_svc.loop import RunLoop
from router_svc.runs import Run
from tests.router.test_run_pieces import config


def fleet(cfg):
    return Fleet(cfg.services.rollout, list(cfg.services.trainer))


def test_no_rollback_when_the_trainers_kept_their_weights():
    assert events.rollback_event(5, 5, "step-000003", {"a": 5}, {"a": 5}) is None


def test_a_rollback_names_the_trainer_that_lost_its_weights_and_the_pools_sent_back_with_it():
    e = events.rollback_event(5, 3, "step-000003", {"a": 5, "b": 4}, {"a": 3, "b": 4}, ["b"])
    assert (e["kind"], e["step"], e["from_step"], e["to_step"], e["checkpoint"]) == (
        "rollback",
        3,
        5,
        3,
        "step-000003",
    )
    assert e["reason"].startswith(
        "trainer 'a' restarted and lost its weights (it came back with version 3, "
        "the checkpoint's; step 5 had left version 5)"
    )
    assert "pool(s) ['b'] went back to the checkpoint too" in e["reason"]
    assert run_wire.event_from_pb(run_wire.event_to_pb("r", e)) == e


class Trainer:
    """A trainer that restarted: whatever it is asked, it holds the checkpoint's version."""

    def __init__(self, version):
        self.version = version

    async def setup(self, spec, *, resume_from="", reload=False, timeout_s=None):
        return TrainerInfo(spec.pool, spec.run_id, self.version)


class Env:
    async def describe(self, name, options):
        return EnvSpec(name, ("speaker", "listener"), ("speaker", "listener"), max_turns=4)


def test_prepare_after_a_trainer_restart_records_the_rollback(tmp_path):
    cfg = config(tmp_path, level="L2")
    d = RunDir(tmp_path)
    for s in (1, 2, 3):
        d.append_event({"kind": "step", "step": s})
    d.append_event({"kind": "eval", "step": 2})
    d.write_progress(
        Progress("r", 3, {"a": 3}, Checkpoint(0, {"a": str(d.checkpoint_dir(0) / "a")}, {"a": 0}))
    )
    emitted = []
    loop = RunLoop(
        cfg,
        emitted.append,
        clients=SimpleNamespace(env=Env(), rollout=fleet(cfg), trainers={"a": Trainer(0)}),
    )
    loop._last_eval = (2, 0.5)  # this router evaluated step 2 before the trainer restarted
    asyncio.run(loop.prepare())
    assert loop.ledger.completed == 0
    assert loop._last_eval is None  # step 2's evaluation went with its event: it runs again
    (rollback,) = emitted
    assert d.read_events() == [rollback]  # the undone steps go, the record of why stays
    assert (rollback["from_step"], rollback["to_step"], rollback["checkpoint"]) == (
        3,
        0,
        "step-000000",
    )
    assert rollback["reason"].startswith("trainer 'a' restarted and lost its weights")
    asyncio.run(loop.prepare())  # a recovery that prepares again: said once
    assert loop.ledger.completed == 0 and emitted == [rollback] and d.read_events() == [rollback]


def test_prepare_that_continues_where_it_was_records_nothing(tmp_path):
    cfg = config(tmp_path, level="L2")
    d = RunDir(tmp_path)
    d.append_event({"kind": "step", "step": 1})
    d.write_progress(Progress("r", 1, {"a": 1}, Checkpoint(0, {"a": "/c"}, {"a": 0})))
    emitted = []
    asyncio.run(
        RunLoop(
            cfg,
            emitted.append,
            clients=SimpleNamespace(env=Env(), rollout=fleet(cfg), trainers={"a": Trainer(1)}),
        ).prepare()
    )
    assert emitted == [] and [e["step"] for e in d.read_events()] == [1]


def watched(run: Run, from_step: int) -> list:
    async def go():
        run.state = "finished"
        return [e for e in [x async for x in run.watch(from_step)] if e["kind"] != "status"]

    return asyncio.run(go())


def test_a_watcher_past_the_rollback_gets_it_and_the_steps_again(tmp_path):
    run = Run(config(tmp_path, level="L2"), loop_factory=lambda cfg, emit: None)
    back = events.rollback_event(3, 1, "step-000001", {"a": 3}, {"a": 1})
    run.events = (
        [{"kind": "step", "step": s} for s in (1, 2, 3)]
        + [back]
        + [{"kind": "step", "step": s} for s in (2, 3, 4)]
    )
    got = [(e["kind"], e["step"]) for e in watched(run, from_step=4)]
    assert got == [("rollback", 1), ("step", 2), ("step", 3), ("step", 4)]
    assert [(e["kind"], e["step"]) for e in watched(run, from_step=0)] == [
        (e["kind"], e["step"]) for e in run.events
    ]


def test_a_resume_past_the_last_checkpoint_keeps_it_for_the_next_rollback(tmp_path):
    """Trainers that kept running: the run continues after step 3, and the checkpoint of step 2
    stays recorded (once it was dropped at the next step, leaving a later fault nothing to go back
    to)."""
    cfg = config(tmp_path, level="L2")
    d = RunDir(tmp_path)
    two = Checkpoint(2, {"a": str(d.checkpoint_dir(2) / "a")}, {"a": 2})
    d.write_progress(Progress("r", 3, {"a": 3}, two, [two]))
    loop = RunLoop(
        cfg, clients=SimpleNamespace(env=Env(), rollout=fleet(cfg), trainers={"a": Trainer(3)})
    )
    asyncio.run(loop.prepare())
    assert loop.ledger.completed == 3
    loop.ledger.completed = 4
    loop.ledger.write_progress()  # what a step writes
    assert d.read_progress().checkpoint == two and d.read_progress().checkpoints == [two]


def test_a_trainer_lost_before_the_first_checkpoint_sends_the_run_back_to_the_start(tmp_path):
    """No checkpoint yet: the restarted trainer holds the starting weights (version 0), and the run
    goes back to step 0, saying so; nothing had to be written at step 0 for it."""
    cfg = config(tmp_path, level="L2")
    d = RunDir(tmp_path)
    for s in (1, 2):
        d.append_event({"kind": "step", "step": s})
    d.write_progress(Progress("r", 2, {"a": 2}))
    emitted = []
    loop = RunLoop(
        cfg,
        emitted.append,
        clients=SimpleNamespace(env=Env(), rollout=fleet(cfg), trainers={"a": Trainer(0)}),
    )
    asyncio.run(loop.prepare())
    (rollback,) = emitted
    assert loop.ledger.completed == 0 and (
        rollback["from_step"],
        rollback["to_step"],
        rollback["checkpoint"],
    ) == (2, 0, "start")
    assert d.read_events() == [rollback] and d.read_progress().completed_step == 0


class KeptTrainer:
    """A trainer that kept running at `version`; a reload puts it back at the checkpoint's."""

    def __init__(self, version, checkpoint_version):
        self.version, self.checkpoint_version = version, checkpoint_version

    async def setup(self, spec, *, resume_from="", reload=False, timeout_s=None):
        if reload:
            self.version = self.checkpoint_version
        return TrainerInfo(spec.pool, spec.run_id, self.version)


def test_a_step_recorded_but_not_counted_is_undone_and_said(tmp_path):
    """The router stopped between writing step 4's event and state.json: the trainer holds step 4's
    weights, state.json and the checkpoint say step 3. The run goes back to the checkpoint, step 4
    is dropped from metrics.jsonl (it is trained again) and a watcher that saw it is told."""
    cfg = config(tmp_path, level="L2")
    d = RunDir(tmp_path)
    for s in (1, 2, 3, 4):
        d.append_event({"kind": "step", "step": s})
    three = Checkpoint(3, {"a": str(d.checkpoint_dir(3) / "a")}, {"a": 3})
    d.write_progress(Progress("r", 3, {"a": 3}, three, [three]))
    emitted, trainer = [], KeptTrainer(4, 3)
    loop = RunLoop(
        cfg,
        emitted.append,
        clients=SimpleNamespace(env=Env(), rollout=fleet(cfg), trainers={"a": trainer}),
    )
    asyncio.run(loop.prepare())
    (rollback,) = emitted
    assert loop.ledger.completed == 3 and trainer.version == 3
    assert (rollback["from_step"], rollback["to_step"]) == (4, 3)
    assert rollback["reason"].startswith(
        "the router stopped after recording step 4 but before state.json counted it"
    )
    assert "lost its weights" not in rollback["reason"]
    assert [e["step"] for e in d.read_events()] == [1, 2, 3, 3] and d.read_events()[-1] == rollback


def test_trainers_past_a_run_dir_with_no_progress_go_back_to_the_start(tmp_path):
    """Step 1 trained and recorded, the router stopped before state.json was first written."""
    cfg = config(tmp_path, level="L2")
    d = RunDir(tmp_path)
    d.append_event({"kind": "step", "step": 1})
    emitted, trainer = [], KeptTrainer(1, 0)
    loop = RunLoop(
        cfg,
        emitted.append,
        clients=SimpleNamespace(env=Env(), rollout=fleet(cfg), trainers={"a": trainer}),
    )
    asyncio.run(loop.prepare())
    (rollback,) = emitted
    assert loop.ledger.completed == 0 and trainer.version == 0
    assert (rollback["from_step"], rollback["to_step"], rollback["checkpoint"]) == (1, 0, "start")
    assert d.read_events() == [rollback] and d.read_progress().completed_step == 0


def test_faults_fail_the_run_only_when_they_come_in_a_row(tmp_path, monkeypatch):
    """MAX_ATTEMPTS counts faults with no step recorded between them: a long segment with a fault
    now and then (a replica scaled down) goes on; the same step failing again and again does not."""
    from router_svc import loop as loop_module
    from router_svc.loop import MAX_ATTEMPTS

    nap = asyncio.sleep
    monkeypatch.setattr(loop_module.asyncio, "sleep", lambda s: nap(0))  # the backoff, skipped
    loop = RunLoop(config(tmp_path, level="L2"), clients=SimpleNamespace(trainers={}))

    async def prepared():
        pass

    loop.prepare = prepared

    async def a_step_then_a_fault(step):
        loop.ledger.completed += 1
        raise Unavailable("replica gone")

    async def the_same_fault(step):
        raise Unavailable("replica gone")

    async def go(fn, times):
        return [await loop._guarded(fn, 0) for _ in range(times)]

    assert asyncio.run(go(a_step_then_a_fault, 3 * MAX_ATTEMPTS)) == [False] * (3 * MAX_ATTEMPTS)
    assert asyncio.run(go(the_same_fault, MAX_ATTEMPTS - 2)) == [False] * (MAX_ATTEMPTS - 2)
    with pytest.raises(Unavailable, match="replica gone"):  # the one before counted too: in a row
        asyncio.run(go(the_same_fault, 1))

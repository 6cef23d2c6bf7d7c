"""The run loop's plain pieces: sharding a Collect over replicas, the run directory, where a
resumed run continues, and the event records."""

from dataclasses import replace

import pytest

from atgrpo.cli.report import eval_line
from atgrpo.config import parse_config
from atgrpo.contract import run_wire
from atgrpo.contract.rollout import EpisodeEnd
from atgrpo.contract.rollout_wire import collect_plan_from_pb, collect_plan_to_pb
from atgrpo.contract.run import status_dict
from atgrpo.errors import FailedPrecondition
from atgrpo.rundir import Checkpoint, Progress, RunDir
from router_svc import events
from router_svc.dispatch import routes_for
from router_svc.loop import RunLoop
from router_svc.steps import StepBatches, collect_plan, step_tasks


def config(tmp_path, level="L3", **run):
    pools = (
        {"a": {"model_path": "/m"}, "b": {"model_path": "/m"}}
        if level == "L3"
        else {"a": {"model_path": "/m", "specialization": "lora"}}
    )
    return parse_config(
        {
            "run": {"name": "r", "run_dir": str(tmp_path), **run},
            "env": {
                "name": "toy",
                "turn_order": ["speaker", "listener"],
                "options": {"symbols": "12"},
            },
            "pools": pools,
            "agents": {
                "speaker": {"pool": "a"},
                "listener": {"pool": "b" if level == "L3" else "a"},
            },
            "services": {
                "env": "e:1",
                "sandbox": "s:1",
                "router": "r:1",
                "rollout": {p: [f"{p}{i}:1" for i in range(2)] for p in pools},
                "trainer": {p: f"t{p}:1" for p in pools},
            },
        }
    )


def test_each_replica_routes_other_pools_to_its_peer():
    rollout = {"a": ["a0:1", "a1:1"], "b": ["b0:1", "b1:1"]}
    assert {a: routes_for(a, rollout) for a in ["a0:1", "a1:1", "b0:1", "b1:1"]} == {
        "a0:1": {"b": "b0:1"},
        "a1:1": {"b": "b1:1"},
        "b0:1": {"a": "a0:1"},
        "b1:1": {"a": "a1:1"},
    }
    # a pool with fewer replicas: the i-th wraps around
    assert routes_for("a1:1", {"a": ["a0:1", "a1:1"], "b": ["b0:1"]}) == {"b": "b0:1"}


def test_plans_round_trip_and_carry_the_turn_order(tmp_path):
    cfg = config(tmp_path, level="L2")
    plan = collect_plan(cfg, step_tasks(0, 0, 2), step=3)
    assert plan.env_options == {"symbols": "12", "turn_order": ["speaker", "listener"]}
    assert {a.adapter for a in plan.agents.values()} == {"speaker", "listener"}  # LoRA: own adapter
    back = collect_plan_from_pb(collect_plan_to_pb(plan))
    assert (
        back.tasks == plan.tasks
        and back.agents == plan.agents
        and back.env_options == plan.env_options
    )
    assert (back.k, back.mode, back.selection, back.parallel) == (
        plan.k,
        plan.mode,
        plan.selection,
        plan.parallel,
    )
    ev = collect_plan(cfg, step_tasks(0, 0, 2, split="eval"), step=3, eval_mode=True)
    assert (ev.k, ev.mode, ev.selection) == (1, "flat", "first")
    assert all(a.sampling.temperature == 0.0 for a in ev.agents.values())


def test_trajectory_grouping_collects_trajectory_plans_and_evaluates_flat(tmp_path):
    cfg = config(tmp_path)
    cfg = replace(cfg, algorithm=replace(cfg.algorithm, grouping="trajectory", k=3))
    plan = collect_plan(cfg, step_tasks(0, 0, 2), step=1)
    assert (plan.mode, plan.k) == ("trajectory", 3)
    assert collect_plan_from_pb(collect_plan_to_pb(plan)).mode == "trajectory"
    ev = collect_plan(cfg, step_tasks(0, 0, 2, split="eval"), step=1, eval_mode=True)
    assert (ev.mode, ev.k) == ("flat", 1)


def test_run_dir_drops_the_steps_a_resume_redoes(tmp_path):
    d = RunDir(tmp_path)
    for s in (1, 2, 3):
        d.append_event({"kind": "step", "step": s})
    d.append_event({"kind": "eval", "step": 3})
    with open(d.metrics, "a") as f:
        f.write('{"kind": "step", "st')  # a write torn by a crash
    assert [e["step"] for e in d.read_events()] == [1, 2, 3, 3]
    assert [e["step"] for e in d.truncate_events(2)] == [1, 2]
    assert [e["step"] for e in d.read_events()] == [1, 2]
    one, two = (
        Checkpoint(1, {"a": "/c"}, {"a": 1}, 0.5, {"a": 10}),
        Checkpoint(2, {"a": "/d"}, {"a": 2}),
    )
    d.write_progress(Progress("r", 2, {"a": 2}, two, [one, two]))
    assert d.read_progress() == Progress("r", 2, {"a": 2}, two, [one, two])


def test_a_step_is_on_disk_before_state_json_counts_it(tmp_path):
    """A kill between the two writes must not lose a step: state.json may only say step 3 is done
    once its event is in metrics.jsonl (else a resume at step 3 never records it)."""
    loop = RunLoop(config(tmp_path), clients=object())
    loop.ledger.versions = {"a": 3, "b": 3}
    seen = []
    write = loop.dir.write_progress
    loop.dir.write_progress = lambda p: (
        seen.append((p.completed_step, loop.dir.read_events())),
        write(p),
    )
    loop.ledger.complete(3, {"kind": "step", "step": 3})
    assert seen == [(3, [{"kind": "step", "step": 3}])]
    assert loop.dir.read_progress().completed_step == 3


def test_the_first_event_makes_the_run_dir(tmp_path):
    """An evaluation run against running services (nothing local made its directory) records."""
    d = RunDir(tmp_path / "run" / "evals" / "start")
    d.append_event({"kind": "eval", "step": 0})
    assert d.read_events() == [{"kind": "eval", "step": 0}]


@pytest.mark.parametrize(
    "versions, expect",
    [
        ({"a": 5, "b": 4}, 5),  # the trainers kept running: continue after the last step
        ({"a": 3, "b": 3}, 3),  # the trainers restarted from the checkpoint of step 3
    ],
)
def test_resume_point(tmp_path, versions, expect):
    loop = RunLoop(config(tmp_path), clients=object())
    loop.ledger.versions = versions
    progress = Progress("r", 5, {"a": 5, "b": 4}, Checkpoint(3, {}, {"a": 3, "b": 3}))
    assert loop._resume_point(progress) == expect


def test_resume_refuses_trainers_that_match_no_recorded_step(tmp_path):
    loop = RunLoop(config(tmp_path), clients=object())
    loop.ledger.versions = {"a": 1, "b": 0}
    with pytest.raises(FailedPrecondition, match="restart the trainers"):
        loop._resume_point(Progress("r", 5, {"a": 5, "b": 4}, Checkpoint(3, {}, {"a": 3, "b": 3})))


def test_the_step_records_a_pools_mismatch_only_when_its_trainer_measured_it():
    from atgrpo.contract.trainer import MISMATCH_KEYS, TrainResult
    from router_svc.outcome import TIMING, pool_metrics

    base = dict.fromkeys(
        ("loss", "approx_kl", "clip_fraction", "grad_norm", "entropy", "push_seconds"), 0.5
    ) | dict.fromkeys(("train_seconds", "staleness_mean", *TIMING), 0.0)
    figures = {k: 0.25 for k in MISMATCH_KEYS}
    on = pool_metrics(TrainResult("r", 1, 2, base | figures, {"a": {"samples": 4.0}}))
    assert on["mismatch"] == figures and "mismatch_kl" not in on  # grouped, not top level
    off = pool_metrics(TrainResult("r", 1, 2, base, {"a": {"samples": 4.0}}))
    assert "mismatch" not in off


def test_events_survive_the_wire():
    batches = StepBatches({}, {}, 0)
    step = events.step_event(
        4,
        batches,
        [EpisodeEnd("t", True, 1, {"speaker": 1.0})],
        {
            "a": {
                "agents": {"speaker": 8},
                "version": 4,
                "loss": 0.5,
                "approx_kl": 0.0,
                "clip_fraction": 0.1,
                "grad_norm": 1.0,
                "entropy": 2.0,
                "push_seconds": 0.1,
                "push_bytes": 10,
                "memory": {"rss_gb": 2.5, "rss_peak_gb": 9.0},
                "mismatch": {"mismatch_kl": 0.125, "mismatch_ratio_p95": 1.5},
            }
        },
        {"rollout_seconds": 1.0, "train_seconds": 2.0, "weight_sync_seconds": 0.1},
    )
    back = run_wire.event_from_pb(run_wire.event_to_pb("r", step))
    assert back["success_rate"] == 1.0 and back["pools"]["a"]["agents"] == {"speaker": 8}
    assert back["pools"]["a"]["version"] == 4 and back["train_seconds"] == 2.0
    assert back["pools"]["a"]["memory"] == {"rss_gb": 2.5, "rss_peak_gb": 9.0}
    assert back["pools"]["a"]["mismatch"] == {"mismatch_kl": 0.125, "mismatch_ratio_p95": 1.5}
    ev = events.eval_event(
        4,
        [
            EpisodeEnd("t", True, 2, {"speaker": 1.0, "listener": 0.5}),
            EpisodeEnd("u", False, 0, {}, error="env down"),
        ],
        order=["speaker", "listener"],
    )
    assert (
        ev["success_rate"] == 1.0
        and ev["failed_episodes"] == 1
        and list(ev["agents"]) == ["speaker", "listener"]
    )
    back = run_wire.event_from_pb(run_wire.event_to_pb("r", ev))
    assert back["agents"]["listener"] == {"reward_mean": 0.5, "turns_mean": 2.0}
    # what `atgrpo eval` shows and prints
    assert (back["episodes"], back["failed_episodes"]) == (
        1,
        1,
    )
    assert eval_line(back).startswith(
        "eval @ step    4  success 1.000 over 1 episodes (1 more ended in an error)"
    )
    status = status_dict("r", "stopped", 3, 10, "/d", 1, "")
    assert run_wire.event_from_pb(run_wire.event_to_pb("r", status)) == status


def test_evaluation_takes_each_task_of_a_finite_split_once(tmp_path):
    import asyncio

    loop = RunLoop(config(tmp_path), clients=object())
    loop._task_ids["eval"] = ["e0", "e1"]  # what ListTasks gave: two eval tasks
    assert sorted(t.task_id for t in asyncio.run(loop.tasks("eval", 0, 4, distinct=True))) == [
        "e0",
        "e1",
    ]
    assert len(asyncio.run(loop.tasks("eval", 0, 4))) == 4  # training walks the list in epochs
    loop._task_ids["gen"] = None  # generated from seeds: any count
    assert len(asyncio.run(loop.tasks("gen", 0, 4, distinct=True))) == 4


def test_collect_pins_each_trainable_policy_at_its_trainers_version(tmp_path):
    from atgrpo.contract.rollout import PolicyRef

    l3 = collect_plan(config(tmp_path), step_tasks(0, 0, 1), step=4, versions={"a": 3, "b": 5})
    assert l3.expected_versions == (PolicyRef("a", "", 3), PolicyRef("b", "", 5))
    l2 = collect_plan(config(tmp_path, level="L2"), step_tasks(0, 0, 1), step=3, versions={"a": 2})
    # no base
    assert l2.expected_versions == (
        PolicyRef("a", "speaker", 2),
        PolicyRef("a", "listener", 2),
    )
    assert collect_plan_from_pb(collect_plan_to_pb(l2)).expected_versions == l2.expected_versions
    assert collect_plan(config(tmp_path), step_tasks(0, 0, 1), step=1).expected_versions == ()

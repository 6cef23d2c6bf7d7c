"""The Collect stream's samples and plans survive the wire whole, the episode included (the router
groups by it)."""

from dataclasses import fields

from atgrpo._proto.v1 import rollout_pb2 as pb
from atgrpo.contract.rollout import AgentPlan, CollectPlan, PolicyRef, Sample, TaskRef
from atgrpo.contract.rollout_wire import event_from_pb, sample_to_pb
from atgrpo.contract.sampling import Sampling

PLAN = CollectPlan(
    env="e",
    tasks=(TaskRef("t", 1, episode=2),),
    agents={},
    turn_order=("a",),
    max_turns=1,
    k=2,
    run_id="r",
    step=3,
)


def a_sample(**kw) -> Sample:
    base = dict(
        task_id="t",
        agent="a",
        turn=1,
        branch=1,
        policy=PolicyRef("p", "x", 4),
        prompt_ids=[1, 2],
        response_ids=[3],
        logprobs=[-0.5],
        team_reward=1.0,
        local_reward=-0.25,
        done=True,
        success=True,
        selected=True,
        sampling=Sampling(temperature=0.5),
        prompt_truncated=True,
        response_truncated=True,
        finish_reason="length",
        info={"why": "x"},
        response_text="3",
        episode=2,
        prompt_text="<user>2",
    )
    return Sample(**{**base, **kw})


def test_every_field_of_a_sample_round_trips():
    s = a_sample()
    defaults = {f.name for f in fields(Sample) if getattr(s, f.name) == f.default}
    assert not defaults, (
        f"set {defaults} to a value other than the default, or the test misses them"
    )
    wire = pb.CollectEvent.FromString(sample_to_pb(s, PLAN).SerializeToString())
    assert event_from_pb(wire) == s


def test_every_field_of_a_collect_plan_round_trips():
    from atgrpo.contract.rollout_wire import collect_plan_from_pb, collect_plan_to_pb

    plan = CollectPlan(
        env="e",
        tasks=(TaskRef("t", 3, "eval", 2),),
        agents={"a": AgentPlan("a", "p", "x", Sampling(temperature=0.5), "be brief")},
        turn_order=("a",),
        max_turns=2,
        k=3,
        mode="trajectory",
        selection="first",
        parallel=True,
        parallel_credit="all_pairs",
        alpha=0.5,
        env_options={"o": 1},
        max_concurrent_tasks=2,
        pool_addresses={"q": "127.0.0.1:5"},
        expected_versions=(PolicyRef("p", "x", 4),),
        run_id="r",
        step=7,
    )
    defaults = {f.name for f in fields(CollectPlan) if getattr(plan, f.name) == f.default}
    assert not defaults, f"set {defaults} to a value other than the default"
    wire = pb.CollectRequest.FromString(collect_plan_to_pb(plan).SerializeToString())
    assert collect_plan_from_pb(wire) == plan

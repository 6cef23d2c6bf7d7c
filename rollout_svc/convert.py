"""Protobuf <-> rollout_svc.types."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2
from atgrpo._proto.v1 import rollout_pb2 as pb
from atgrpo.sdk.convert import dict_from, struct_from
from rollout_svc.types import (
    AgentPlan,
    CollectPlan,
    EpisodeEnd,
    PolicyRef,
    Sample,
    Sampling,
    TaskRef,
)

_MODES = {pb.COLLECT_MODE_UNSPECIFIED: "tree", pb.COLLECT_MODE_TREE: "tree", pb.COLLECT_MODE_FLAT: "flat"}
_SELECTIONS = {pb.SELECTION_UNSPECIFIED: "best", pb.SELECTION_BEST: "best", pb.SELECTION_FIRST: "first"}


def sampling_from_pb(m: common_pb2.SamplingParams) -> Sampling:
    return Sampling(temperature=m.temperature, top_p=m.top_p or 1.0, top_k=m.top_k, max_tokens=m.max_tokens or 256,
                    max_prompt_tokens=m.max_prompt_tokens or 2048, stop=tuple(m.stop),
                    seed=m.seed if m.HasField("seed") else None)


def sampling_to_pb(s: Sampling) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                     max_tokens=s.max_tokens, max_prompt_tokens=s.max_prompt_tokens,
                                     stop=list(s.stop), seed=s.seed)


def policy_to_pb(p: PolicyRef) -> common_pb2.PolicyVersion:
    return common_pb2.PolicyVersion(pool=p.pool, adapter=p.adapter, version=p.version)


def policy_from_pb(m: common_pb2.PolicyVersion) -> PolicyRef:
    return PolicyRef(m.pool, m.adapter, m.version)


def collect_plan_from_pb(m: pb.CollectRequest) -> CollectPlan:
    agents = {a.name: AgentPlan(a.name, a.pool, a.adapter, sampling_from_pb(a.sampling), a.system_prompt)
              for a in m.agents}
    return CollectPlan(
        env=m.env, tasks=tuple(TaskRef(t.task_id, t.seed, t.split or "train") for t in m.tasks), agents=agents,
        turn_order=tuple(m.turn_order), max_turns=m.max_turns, k=m.k or 1, mode=_MODES[m.mode],
        selection=_SELECTIONS[m.selection], alpha=m.alpha, env_options=dict_from(m.env_options),
        max_concurrent_tasks=m.max_concurrent_tasks or 8, pool_addresses=dict(m.pool_addresses),
        run_id=m.run_id, step=m.step)


def sample_to_pb(s: Sample, plan: CollectPlan) -> pb.CollectEvent:
    return pb.CollectEvent(sample=pb.TurnSample(
        run_id=plan.run_id, step=plan.step, task_id=s.task_id, agent=s.agent, turn=s.turn, branch=s.branch,
        policy=policy_to_pb(s.policy), prompt_token_ids=s.prompt_ids, response_token_ids=s.response_ids,
        response_logprobs=s.logprobs, team_reward=s.team_reward, local_reward=s.local_reward, done=s.done,
        success=s.success, selected=s.selected, prompt_truncated=s.prompt_truncated,
        response_truncated=s.response_truncated, finish_reason=s.finish_reason, info=struct_from(s.info),
        sampling=sampling_to_pb(s.sampling)))


def end_to_pb(e: EpisodeEnd, plan: CollectPlan) -> pb.CollectEvent:
    return pb.CollectEvent(episode_end=pb.EpisodeEnd(
        run_id=plan.run_id, step=plan.step, task_id=e.task_id, success=e.success, turns=e.turns,
        agent_rewards=e.agent_rewards, error=e.error))

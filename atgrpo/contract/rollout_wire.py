"""Protobuf <-> atgrpo.contract.rollout (and the sampling settings every service passes on)."""

from __future__ import annotations

import math
import re

from atgrpo._proto.v1 import common_pb2
from atgrpo._proto.v1 import rollout_pb2 as pb
from atgrpo.contract.address import DiscoveryError, parse_target
from atgrpo.contract.env_wire import dict_from, struct_from
from atgrpo.contract.rollout import (
    AgentPlan,
    CollectPlan,
    Completion,
    EpisodeEnd,
    Generation,
    PolicyRef,
    RolloutInfo,
    Sample,
    TaskRef,
    WeightsLoaded,
)
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.service_wire import service_info_from_pb
from atgrpo.errors import InvalidArgument

_MODES = {
    pb.COLLECT_MODE_UNSPECIFIED: "tree",
    pb.COLLECT_MODE_TREE: "tree",
    pb.COLLECT_MODE_FLAT: "flat",
    pb.COLLECT_MODE_TRAJECTORY: "trajectory",
}
_CREDITS = {
    pb.PARALLEL_CREDIT_UNSPECIFIED: "paired",
    pb.PARALLEL_CREDIT_PAIRED: "paired",
    pb.PARALLEL_CREDIT_ALL_PAIRS: "all_pairs",
}
_SELECTIONS = {
    pb.SELECTION_UNSPECIFIED: "best",
    pb.SELECTION_BEST: "best",
    pb.SELECTION_FIRST: "first",
}


# Generous sanity caps for what arrives over the wire; the engine checks its own context length.
MAX_TOKENS = 1 << 20
MAX_STOPS = 64


def check_sampling(m: common_pb2.SamplingParams, where: str = "sampling") -> None:
    """INVALID_ARGUMENT for settings no engine can sample with (NaN, negative, empty stops), so
    they fail here, named, not inside a batch or as NaN log-probs that would reach the trainer."""
    problems = []
    if not (math.isfinite(m.temperature) and m.temperature >= 0):
        problems.append(f"temperature {m.temperature} must be a finite number >= 0 (0 = greedy)")
    if not (math.isfinite(m.top_p) and 0 <= m.top_p <= 1):
        problems.append(f"top_p {m.top_p} must be in (0, 1] (0 or unset = 1, off)")
    if not 0 <= m.max_tokens <= MAX_TOKENS:
        problems.append(
            f"max_tokens {m.max_tokens} must be between 1 and {MAX_TOKENS} (0 = the default 256)"
        )
    if not 0 <= m.max_prompt_tokens <= MAX_TOKENS:
        problems.append(
            f"max_prompt_tokens {m.max_prompt_tokens} must be between 1 and {MAX_TOKENS} "
            "(0 = the default 2048)"
        )
    if len(m.stop) > MAX_STOPS or any(not s for s in m.stop):
        problems.append(
            f"stop must hold at most {MAX_STOPS} non-empty strings (an empty one would end every "
            "response at once)"
        )
    if problems:
        raise InvalidArgument(f"{where}: " + "; ".join(problems))


def sampling_from_pb(m: common_pb2.SamplingParams, where: str = "sampling") -> Sampling:
    check_sampling(m, where)
    return Sampling(
        temperature=m.temperature,
        top_p=m.top_p or 1.0,
        top_k=m.top_k,
        max_tokens=m.max_tokens or 256,
        max_prompt_tokens=m.max_prompt_tokens or 2048,
        stop=tuple(m.stop),
        seed=m.seed if m.HasField("seed") else None,
    )


def sampling_to_pb(sp: Sampling) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        max_tokens=sp.max_tokens,
        max_prompt_tokens=sp.max_prompt_tokens,
        stop=list(sp.stop),
        seed=sp.seed,
    )


def policy_to_pb(p: PolicyRef) -> common_pb2.PolicyVersion:
    return common_pb2.PolicyVersion(pool=p.pool, adapter=p.adapter, version=p.version)


def policy_from_pb(m: common_pb2.PolicyVersion) -> PolicyRef:
    return PolicyRef(m.pool, m.adapter, m.version)


_HOST = re.compile(r"^[A-Za-z0-9_.-]+$|^[0-9A-Fa-f:.]+$")


def check_address(address: str, field: str) -> None:
    """INVALID_ARGUMENT unless `address` is host:port (or dns:///host:port): a malformed one
    would otherwise only fail, call after call, once something dials it."""
    try:
        target = parse_target(address)
    except DiscoveryError as err:
        raise InvalidArgument(f"{field}: {err}") from None
    if not _HOST.match(target.host):
        raise InvalidArgument(
            f"{field}: {address[:200]!r} has characters no host name has; write host:port"
        )


def _enum(table: dict, value: int, field: str, enum) -> str:
    if value not in table:
        raise InvalidArgument(
            f"{field} {value} is not a known value; use one of {list(enum.keys())}"
        )
    return table[value]


def collect_plan_from_pb(m: pb.CollectRequest) -> CollectPlan:
    for pool, address in m.pool_addresses.items():
        check_address(address, f"pool_addresses[{pool[:100]!r}]")
    agents = {
        a.name: AgentPlan(
            a.name,
            a.pool,
            a.adapter,
            sampling_from_pb(a.sampling, f"agent {a.name!r} sampling"),
            a.system_prompt,
        )
        for a in m.agents
    }
    return CollectPlan(
        env=m.env,
        tasks=tuple(TaskRef(t.task_id, t.seed, t.split or "train", t.episode) for t in m.tasks),
        agents=agents,
        turn_order=tuple(m.turn_order),
        max_turns=m.max_turns,
        k=m.k or 1,
        mode=_enum(_MODES, m.mode, "mode", pb.CollectMode),
        selection=_enum(_SELECTIONS, m.selection, "selection", pb.Selection),
        alpha=m.alpha,
        env_options=dict_from(m.env_options, "env_options"),
        max_concurrent_tasks=m.max_concurrent_tasks or 8,
        pool_addresses=dict(m.pool_addresses),
        run_id=m.run_id,
        step=m.step,
        parallel=m.parallel,
        parallel_credit=_enum(_CREDITS, m.parallel_credit, "parallel_credit", pb.ParallelCredit),
        expected_versions=tuple(policy_from_pb(v) for v in m.expected_versions),
    )


def collect_plan_to_pb(p: CollectPlan) -> pb.CollectRequest:
    """The inverse of collect_plan_from_pb (the router builds plans, replicas run them)."""
    modes = {v: k for k, v in _MODES.items() if k}
    selections = {v: k for k, v in _SELECTIONS.items() if k}
    return pb.CollectRequest(
        run_id=p.run_id,
        step=p.step,
        env=p.env,
        env_options=struct_from(p.env_options),
        tasks=[
            pb.TaskRef(task_id=t.task_id, seed=t.seed, split=t.split, episode=t.episode)
            for t in p.tasks
        ],
        agents=[
            pb.AgentRollout(
                name=a.name,
                pool=a.pool,
                adapter=a.adapter,
                sampling=sampling_to_pb(a.sampling),
                system_prompt=a.system_prompt,
            )
            for a in p.agents.values()
        ],
        turn_order=list(p.turn_order),
        max_turns=p.max_turns,
        k=p.k,
        mode=modes[p.mode],
        selection=selections[p.selection],
        alpha=p.alpha,
        max_concurrent_tasks=p.max_concurrent_tasks,
        pool_addresses=p.pool_addresses,
        parallel=p.parallel,
        parallel_credit={v: k for k, v in _CREDITS.items() if k}[p.parallel_credit],
        expected_versions=[policy_to_pb(v) for v in p.expected_versions],
    )


def sample_to_pb(s: Sample, plan: CollectPlan) -> pb.CollectEvent:
    return pb.CollectEvent(
        sample=pb.TurnSample(
            run_id=plan.run_id,
            step=plan.step,
            task_id=s.task_id,
            agent=s.agent,
            turn=s.turn,
            branch=s.branch,
            policy=policy_to_pb(s.policy),
            prompt_token_ids=s.prompt_ids,
            response_token_ids=s.response_ids,
            response_logprobs=s.logprobs,
            team_reward=s.team_reward,
            local_reward=s.local_reward,
            done=s.done,
            success=s.success,
            selected=s.selected,
            prompt_truncated=s.prompt_truncated,
            response_truncated=s.response_truncated,
            finish_reason=s.finish_reason,
            info=struct_from(s.info),
            sampling=sampling_to_pb(s.sampling),
            response_text=s.response_text,
            episode=s.episode,
            prompt_text=s.prompt_text,
        )
    )


def end_to_pb(e: EpisodeEnd, plan: CollectPlan) -> pb.CollectEvent:
    return pb.CollectEvent(
        episode_end=pb.EpisodeEnd(
            run_id=plan.run_id,
            step=plan.step,
            task_id=e.task_id,
            success=e.success,
            turns=e.turns,
            agent_rewards=e.agent_rewards,
            error=e.error,
            timing=e.timing,
        )
    )


def event_from_pb(m: pb.CollectEvent) -> Sample | EpisodeEnd:
    """A Collect stream event as the plain type the router groups (inverse of
    sample_to_pb/end_to_pb)."""
    if m.WhichOneof("event") == "episode_end":
        e = m.episode_end
        return EpisodeEnd(
            e.task_id, e.success, e.turns, dict(e.agent_rewards), e.error, dict(e.timing)
        )
    s = m.sample
    return Sample(
        task_id=s.task_id,
        agent=s.agent,
        turn=s.turn,
        branch=s.branch,
        policy=policy_from_pb(s.policy),
        prompt_ids=list(s.prompt_token_ids),
        response_ids=list(s.response_token_ids),
        logprobs=list(s.response_logprobs),
        team_reward=s.team_reward,
        local_reward=s.local_reward,
        done=s.done,
        success=s.success,
        selected=s.selected,
        sampling=sampling_from_pb(s.sampling),
        prompt_truncated=s.prompt_truncated,
        response_truncated=s.response_truncated,
        finish_reason=s.finish_reason,
        info=dict_from(s.info),
        response_text=s.response_text,
        episode=s.episode,
        prompt_text=s.prompt_text,
    )


def generation_to_pb(g: Generation) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        prompt_token_ids=g.prompt_ids,
        prompt_truncated=g.prompt_truncated,
        policy=policy_to_pb(g.policy),
        timing=g.timing,
        prompt_text=g.prompt_text,
        completions=[
            pb.Completion(
                token_ids=c.token_ids,
                logprobs=c.logprobs,
                text=c.text,
                finish_reason=c.finish_reason,
            )
            for c in g.completions
        ],
    )


def generation_from_pb(m: pb.GenerateResponse) -> Generation:
    return Generation(
        list(m.prompt_token_ids),
        [
            Completion(list(c.token_ids), list(c.logprobs), c.text, c.finish_reason)
            for c in m.completions
        ],
        policy_from_pb(m.policy),
        m.prompt_truncated,
        dict(m.timing),
        m.prompt_text,
    )


def info_to_pb(i: RolloutInfo, service: common_pb2.ServiceInfo) -> pb.RolloutInfo:
    return pb.RolloutInfo(
        service=service,
        engine=i.engine,
        device=i.device,
        policies=[policy_to_pb(p) for p in i.policies],
        weight_dtypes=i.weight_dtypes,
    )


def info_from_pb(m: pb.RolloutInfo) -> RolloutInfo:
    return RolloutInfo(
        m.engine,
        m.device,
        tuple(policy_from_pb(p) for p in m.policies),
        service_info_from_pb(m.service),
        dict(m.weight_dtypes),
    )


def loaded_to_pb(w: WeightsLoaded) -> pb.LoadWeightsResponse:
    return pb.LoadWeightsResponse(
        policy=policy_to_pb(w.policy), bytes_received=w.bytes_received, load_ms=w.load_ms
    )


def loaded_from_pb(m: pb.LoadWeightsResponse) -> WeightsLoaded:
    return WeightsLoaded(policy_from_pb(m.policy), m.bytes_received, m.load_ms)

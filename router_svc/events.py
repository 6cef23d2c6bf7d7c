"""A step's, an evaluation's and a rollback's event records (one JSON line each in metrics.jsonl).

The dict is the record: the run directory keeps it, WatchRun replays it (atgrpo.contract.run_wire),
and the CLI draws its curves from it, so the three never disagree.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from atgrpo.contract.rollout import EpisodeEnd
from atgrpo.contract.run import rollback_dict
from router_svc.steps import StepBatches, episode_metrics


def step_event(
    step: int,
    batches: StepBatches,
    ends: Sequence[EpisodeEnd],
    pools: Mapping[str, Mapping[str, Any]],
    timings: Mapping[str, float],
    order: Sequence[str] = (),
) -> dict[str, Any]:
    """Step metrics: the team's success, per agent (reward, groups, advantages), per pool (update).
    Agents are listed in `order` (the turn order) first."""
    ep = episode_metrics(ends)
    agents = {}
    names = [a for a in order if a in batches.agents] + [
        a for a in batches.agents if a not in order
    ]
    for name, st in ((n, batches.agents[n]) for n in names):
        adv = st.advantages
        agents[name] = {
            "reward_mean": st.reward_sum / st.samples if st.samples else 0.0,
            "success_rate": ep["success_rate"],
            "turns_mean": ep["turns_mean"],
            "samples": st.samples,
            "groups": st.groups,
            "zero_variance_fraction": st.zero_variance_groups / st.groups if st.groups else 0.0,
            "advantage_mean": statistics.fmean(adv) if adv else 0.0,
            "advantage_std": statistics.pstdev(adv) if len(adv) > 1 else 0.0,
            "prompt_truncated_fraction": st.prompts_cut / st.samples if st.samples else 0.0,
            "response_truncated_fraction": st.responses_cut / st.samples if st.samples else 0.0,
        }
    samples = sum(a["samples"] for a in agents.values())
    reward = (
        sum(a["reward_mean"] * a["samples"] for a in agents.values()) / samples if samples else 0.0
    )
    return {
        "kind": "step",
        "step": step,
        "success_rate": ep["success_rate"],
        "reward_mean": reward,
        "episodes": int(ep["episodes"]),
        "failed_episodes": int(ep["failed_episodes"]),
        "dropped_samples": batches.dropped,
        "agents": agents,
        "pools": {p: dict(m) for p, m in pools.items()},
        **timings,
        **timing_fields(ends, pools, timings.get("rollout_seconds", 0.0)),
    }


def _slowest_replica(collects: Sequence[Mapping[str, float]]) -> tuple[float, float, float]:
    """(prefill, decode, env seconds) of the replica whose Collect took longest. A replica runs
    several Collects at once (router_svc.dispatch sends its tasks in chunks) on one model, which
    splits each batch's seconds among their requests: so its prefill and decode seconds are its
    Collects' summed, and its env seconds the longest Collect's (the others' env calls overlap
    its generation). A Collect without its replica's index is a replica of its own."""
    by: dict[object, list[Mapping[str, float]]] = {}
    for i, t in enumerate(collects):
        by.setdefault(t.get("replica", ("alone", i)), []).append(t)
    if not by:
        return 0.0, 0.0, 0.0
    slow = max(by.values(), key=lambda ts: max(t.get("collect_s", 0.0) for t in ts))
    return (
        sum(t.get("prefill_s", 0.0) for t in slow),
        sum(t.get("decode_s", 0.0) for t in slow),
        max(t.get("env_s", 0.0) for t in slow),
    )


def timing_fields(
    ends: Sequence[EpisodeEnd], pools: Mapping[str, Mapping[str, Any]], rollout_s: float
) -> dict[str, float]:
    """Where a step's time went, and at what FLOP rate (docs/observability.md, "A step's time").

    The seconds follow what the step waited for: the replica whose Collect took longest (each
    Collect reports on its last EpisodeEnd, rollout_svc.tree; _slowest_replica) and the pool whose
    update took longest, so they split rollout_seconds and train_seconds. time_wait_s is the rest of
    rollout_seconds: rendering, batching, the RPCs, the router's own work. Tokens and FLOP rates are
    over every replica and every pool: FLOPs over the engines' (or the updates') seconds, and the
    mfu their ratio to what each process's measured matmul rate does in the same seconds. A rate
    is left out when nothing measured it (a vLLM engine on GPU has no matmul rate)."""
    collects = [e.timing for e in ends if e.timing]
    prefill, decode, env = _slowest_replica(collects)
    env = min(env, max(0.0, rollout_s - prefill - decode))
    out = {
        "time_prefill_s": prefill,
        "time_decode_s": decode,
        "time_env_s": env,
        "time_wait_s": max(0.0, rollout_s - prefill - decode - env),
        "prefill_tokens": sum(t.get("prefill_tokens", 0.0) for t in collects),
        "decode_tokens": sum(t.get("decode_tokens", 0.0) for t in collects),
    }
    gen_s = sum(t.get("prefill_s", 0.0) + t.get("decode_s", 0.0) for t in collects)
    out.update(
        _rates(
            "gen",
            sum(t.get("gen_flops", 0.0) for t in collects),
            gen_s,
            sum(t.get("gen_matmul_flops", 0.0) for t in collects),
        )
    )

    updates = [m for m in pools.values() if "time_forward_s" in m]
    slow_pool = max(updates, key=lambda m: m.get("train_seconds", 0.0), default={})
    out.update(
        {
            k: slow_pool.get(k, 0.0)
            for k in ("time_forward_s", "time_backward_s", "time_optimizer_s")
        }
    )
    out["update_tokens"] = sum(m.get("update_tokens", 0.0) for m in updates)
    seconds = [
        m["time_forward_s"] + m.get("time_backward_s", 0.0) + m.get("time_optimizer_s", 0.0)
        for m in updates
    ]
    out.update(
        _rates(
            "update",
            sum(m.get("update_flops", 0.0) for m in updates),
            sum(seconds),
            sum(
                s * m.get("matmul_flops_per_s", 0.0) for s, m in zip(seconds, updates, strict=True)
            ),
        )
    )
    return out


def _rates(part: str, flops: float, seconds: float, matmul_flops: float) -> dict[str, float]:
    """`part`_flops_per_s, and `part`_mfu and `part`_matmul_flops_per_s where a matmul rate was
    measured: `matmul_flops` is what it does in the same `seconds`."""
    if flops <= 0 or seconds <= 0:
        return {}
    out = {f"{part}_flops_per_s": flops / seconds}
    if matmul_flops > 0:
        out |= {
            f"{part}_mfu": flops / matmul_flops,
            f"{part}_matmul_flops_per_s": matmul_flops / seconds,
        }
    return out


def eval_event(step: int, ends: Sequence[EpisodeEnd], order: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluation: success over the eval tasks, and each agent's mean return (its rewards summed
    over an episode's turns) over the episodes; a step event's agent reward_mean is per sample
    instead."""
    ok = [e for e in ends if not e.error]
    seen = {a for e in ok for a in e.agent_rewards}
    names = [a for a in order if a in seen] + sorted(seen - set(order))
    agents = {
        a: {
            "reward_mean": statistics.fmean(e.agent_rewards.get(a, 0.0) for e in ok),
            "turns_mean": statistics.fmean(e.turns for e in ok),
        }
        for a in names
    }
    ep = episode_metrics(ends)
    return {
        "kind": "eval",
        "step": step,
        "success_rate": ep["success_rate"],
        "episodes": int(ep["episodes"]),
        "failed_episodes": int(ep["failed_episodes"]),
        "agents": agents,
    }


def rollback_event(
    from_step: int,
    to_step: int,
    checkpoint: str,
    recorded: Mapping[str, int],
    held: Mapping[str, int],
    reloaded: Sequence[str] = (),
    counted: int | None = None,
) -> dict[str, Any] | None:
    """The record of going back from step `from_step` to the checkpoint of `to_step`, or None when
    the run continues where it was. `recorded`: pool -> version after step `counted` (state.json;
    default from_step); `held`: the versions the trainers came back with (a restarted trainer loads
    the checkpoint); `reloaded`: pools sent back to the checkpoint by the router. A `from_step`
    past `counted`: steps whose events were recorded before the router stopped, uncounted."""
    counted = from_step if counted is None else counted
    if to_step >= from_step:
        return None
    lost = [
        f"trainer {p!r} restarted and lost its weights (it came back with version {v}, the "
        f"checkpoint's; step {counted} had left version {recorded.get(p)})"
        for p, v in held.items()
        if v != recorded.get(p) and p not in reloaded
    ]
    if from_step > counted:
        lost.append(
            f"the router stopped after recording step {from_step} but before state.json counted it "
            f"(it counts step {counted})"
        )
    reason = (
        "; ".join(lost) or f"the trainers hold the versions of the checkpoint of step {to_step}"
    )
    if reloaded:
        reason += (
            f"; pool(s) {list(reloaded)} went back to the checkpoint too,"
            " so every pool holds the same step"
        )
    return rollback_dict(from_step, to_step, checkpoint, reason)

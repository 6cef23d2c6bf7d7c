"""What a step's collection and updates came to: whether every episode finished, and a pool's
update as a step event records it (shared by the loop and the pipeline)."""

from __future__ import annotations

from typing import Any

from atgrpo.contract.rollout import EpisodeEnd
from atgrpo.contract.trainer import MISMATCH_KEYS, TrainResult
from atgrpo.contract.trainer_wire import MEMORY


class StepIncomplete(RuntimeError):
    """Some episode of the step did not finish (a service went away mid-step): the step's samples
    are dropped whole and it is collected again."""


class EpisodeFailed(RuntimeError):
    """An episode failed in a way that does not change on a retry (the environment's code raised,
    a request was invalid): the run fails at once with the message, not after a dozen retries."""


# How an episode's error names its cause (rollout_svc.tree: "<error class>: <message>"); these
# fail the same way every time.
_DETERMINISTIC = ("EnvCodeError", "InvalidArgument")


# Where the update's time went, and its FLOPs: events.timing_fields reads them.
TIMING = (
    "time_forward_s",
    "time_backward_s",
    "time_optimizer_s",
    "update_tokens",
    "update_flops",
    "matmul_flops_per_s",
)


def pool_metrics(r: TrainResult) -> dict[str, Any]:
    """The trainer's report of an update; `agents` (agent -> samples) says whose samples it took."""
    return {
        "agents": {a: int(m["samples"]) for a, m in r.agents.items()},
        "version": r.version,
        **{
            k: r.metrics[k]
            for k in (
                "loss",
                "approx_kl",
                "clip_fraction",
                "grad_norm",
                "entropy",
                "push_seconds",
                "train_seconds",
                "staleness_mean",
                *TIMING,
            )
        },
        # the KL to the reference is measured only with kl_coef > 0
        **({"kl_ref": r.metrics["kl_ref"]} if "kl_ref" in r.metrics else {}),
        **(
            {"memory": memory}
            if (memory := {k: r.metrics[k] for k in MEMORY if k in r.metrics})
            else {}
        ),
        # the engine's log-probs against the trainer's: only when the trainer scored its own
        **(
            {"mismatch": mismatch}
            if (mismatch := {k: r.metrics[k] for k in MISMATCH_KEYS if k in r.metrics})
            else {}
        ),
        **{
            k: int(r.metrics.get(k, 0))
            for k in ("push_bytes", "tokens", "samples", "staleness_max", "masked_tokens")
        },
        **(
            {"agent_grad_norm": norms}
            if (norms := {a: m["grad_norm"] for a, m in r.agents.items() if "grad_norm" in m})
            else {}
        ),
    }


def check_complete(ends: list[EpisodeEnd], tasks: int) -> None:
    failed = [e for e in ends if e.error]
    fatal = next((e for e in failed if e.error.split(":", 1)[0] in _DETERMINISTIC), None)
    if fatal is not None:
        raise EpisodeFailed(
            f"the episode of task {fatal.task_id!r} failed: {fatal.error} (not retried: "
            "it would fail the same way)"
        )
    if failed or len(ends) != tasks:
        first = failed[0].error if failed else f"{tasks - len(ends)} episodes never ended"
        raise StepIncomplete(
            f"{len(failed) or tasks - len(ends)} of {tasks} episodes did not finish ({first})"
        )

"""Where advantage estimators and policy losses are found by the name a run config gives them
(`algorithm.grouping`, `algorithm.policy_loss`), as verl's `register_adv_est` and
`register_policy_loss` do: one function, one decorator, one config name.

    from atgrpo.algo.registry import register_adv_est

    @register_adv_est("my_estimator")
    def my_estimator(samples, rewards, *, norm_std) -> Estimate:
        ...   # each sample's advantage, whether its group's rewards are all equal, its group id

A service process finds an estimator or loss registered in another package through the entry
point groups `atgrpo.advantages` and `atgrpo.losses` (name = "module:function" of the decorated
function, whose module registering it is enough), loaded the first time a name is not known. The
built-ins: estimators `turn` (AT-GRPO), `trajectory`, `turn_loo` and the grouping ablation's
`task`, `task_agent`, `task_turn` (atgrpo.algo.estimators), losses
`ppo_clip` and `decoupled` (atgrpo.algo.loss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # at run time only estimate() needs it: the router starts without torch
    import torch

ADVANTAGE_GROUP = "atgrpo.advantages"
LOSS_GROUP = "atgrpo.losses"


@dataclass(frozen=True)
class Estimate:
    """An estimator's answer for B samples."""

    advantages: torch.Tensor  # (B,) float
    # (B,) bool: the sample's group has no reward spread (filter: zero_variance drops it)
    zero_variance: torch.Tensor
    groups: torch.Tensor  # (B,) int64: the sample's group (counted in the step's metrics)


# (samples, rewards (B,) float64 = alpha * team + local, *, norm_std) -> Estimate
Estimator = Callable[..., Estimate]
# (logprobs, old_logprobs, advantages, mask, cfg: LossConfig, *, prox_logprobs, ref_logprobs,
#  entropy) -> (loss to minimise, metrics with at least "masked_tokens")
Loss = Callable[..., "tuple[torch.Tensor, dict[str, float]]"]


@dataclass(frozen=True)
class AdvantageEstimator:
    name: str
    fn: Estimator
    # How the rollout samples for it: "tree" (K branches per agent per turn from one state, the
    # best goes on) or "trajectory" (K independent episodes per task, each sample carrying its
    # episode's return).
    collect: Literal["tree", "trajectory"] = "tree"


@dataclass(frozen=True)
class PolicyLoss:
    name: str
    fn: Loss
    # Takes the proximal policy's log-probs (the trainer's own, under its weights before the
    # update), which the ratio sits on when the trainer scores them: behav_imp_cap > 0 (the
    # engine's log-probs are not the trainer's) or max_staleness > 0 (the sampler may be versions
    # behind).
    proximal: bool = False


class _Deferred:
    """A built-in's function, imported on its first call: a config names and checks a built-in
    (its collect, proximal) without importing torch, which the router and the CLI start without.
    Its module registers the real function in its place when imported."""

    def __init__(self, module: str, qualname: str):
        self.__module__, self.__qualname__ = module, qualname

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # importing the module registers the real function in this one's place
        return getattr(import_module(self.__module__), self.__qualname__)(*args, **kwargs)


# The built-ins, by name: what a config check needs of them, and where their code is.
_BUILTIN_ESTIMATORS = {
    "turn": AdvantageEstimator("turn", _Deferred("atgrpo.algo.estimators", "at_grpo")),
    "trajectory": AdvantageEstimator(
        "trajectory", _Deferred("atgrpo.algo.estimators", "trajectory_grpo"), "trajectory"
    ),
    "turn_loo": AdvantageEstimator("turn_loo", _Deferred("atgrpo.algo.estimators", "at_grpo_loo")),
    **{
        name: AdvantageEstimator(name, _Deferred("atgrpo.algo.estimators", fn))
        for name, fn in (
            ("task", "by_task"),
            ("task_agent", "by_task_agent"),
            ("task_turn", "by_task_turn"),
        )
    },
}
_BUILTIN_LOSSES = {
    "ppo_clip": PolicyLoss("ppo_clip", _Deferred("atgrpo.algo.loss", "ppo_clip")),
    "decoupled": PolicyLoss("decoupled", _Deferred("atgrpo.algo.loss", "decoupled"), True),
}
_ESTIMATORS: dict[str, AdvantageEstimator] = dict(_BUILTIN_ESTIMATORS)
_LOSSES: dict[str, PolicyLoss] = dict(_BUILTIN_LOSSES)


def register_adv_est(
    name: str, *, collect: Literal["tree", "trajectory"] = "tree"
) -> Callable[[Estimator], Estimator]:
    """Register `fn(samples, rewards, *, norm_std)` as the advantage estimator `name`."""
    if collect not in ("tree", "trajectory"):
        raise ValueError(f"collect must be 'tree' or 'trajectory', not {collect!r}")

    def add(fn: Estimator) -> Estimator:
        _add(_ESTIMATORS, _BUILTIN_ESTIMATORS, AdvantageEstimator(name, fn, collect))
        return fn

    return add


def register_policy_loss(name: str, *, proximal: bool = False) -> Callable[[Loss], Loss]:
    """Register `fn(logprobs, old_logprobs, advantages, mask, cfg, *, prox_logprobs, ref_logprobs,
    entropy)` as the policy loss `name`; `proximal`: it uses prox_logprobs (the trainer's own
    log-probs, given when behav_imp_cap > 0 or max_staleness > 0)."""

    def add(fn: Loss) -> Loss:
        _add(_LOSSES, _BUILTIN_LOSSES, PolicyLoss(name, fn, proximal))
        return fn

    return add


def _add(table: dict[str, Any], builtins: dict[str, Any], entry: Any) -> None:
    old = table.get(entry.name)
    builtin = builtins.get(entry.name)
    if builtin is not None and replace(builtin, fn=entry.fn) != entry:
        raise ValueError(
            f"{entry!r} registers the built-in {entry.name!r} unlike atgrpo.algo.registry's table "
            f"of built-ins ({builtin!r}): make the two agree"
        )
    # Re-registering the same function (a module imported again, a test run twice) is harmless.
    if old is not None and _where(old.fn) != _where(entry.fn):
        raise ValueError(
            f"{entry.name!r} is already registered ({old.fn.__module__}.{old.fn.__qualname__}); "
            "pick another name"
        )
    table[entry.name] = entry


def _where(fn: Callable) -> tuple[str, str]:
    return getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")


def adv_estimator(name: str) -> AdvantageEstimator:
    return _find(
        _ESTIMATORS,
        ADVANTAGE_GROUP,
        name,
        "advantage estimator",
        "algorithm.grouping",
        "register_adv_est",
    )


def policy_loss_named(name: str) -> PolicyLoss:
    return _find(
        _LOSSES, LOSS_GROUP, name, "policy loss", "algorithm.policy_loss", "register_policy_loss"
    )


def estimator_names() -> list[str]:
    return sorted(_ESTIMATORS)


def loss_names() -> list[str]:
    return sorted(_LOSSES)


def _find(table: dict, group: str, name: str, what: str, setting: str, decorator: str):
    if name not in table:
        for ep in entry_points(group=group):
            if ep.name == name:
                ep.load()  # importing the module registers it
    if name not in table:
        raise KeyError(
            f"no {what} named {name!r} (known: {', '.join(sorted(table))}); set {setting} to one "
            f"of them, or register one with @{decorator}({name!r}) in a module the process imports "
            f"(entry point group {group!r})"
        )
    return table[name]


def estimate(
    name: str, samples: Sequence[Any], rewards: torch.Tensor, *, norm_std: bool
) -> Estimate:
    """The named estimator's Estimate for `samples`, checked for shape."""
    import torch

    got = adv_estimator(name).fn(samples, rewards, norm_std=norm_std)
    b = (rewards.numel(),)
    if (
        not isinstance(got, Estimate)
        or (got.advantages.shape, got.zero_variance.shape, got.groups.shape) != (b, b, b)
        or got.zero_variance.dtype != torch.bool
    ):
        raise ValueError(
            f"advantage estimator {name!r} must return an Estimate of (B,) tensors (zero_variance "
            f"bool) for B = {b[0]} samples, not {got!r:.200}"
        )
    return got

"""The run config's rules beyond its types: value ranges and cross-field checks (names, pools,
agents, addresses), each broken rule reported with the field and the fix."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from atgrpo.config_parse import (
    AT_LEAST_1,
    NON_NEG,
    Checks,
    Errors,
    choices_text,
    did_you_mean,
    parse_bytes,
)
from atgrpo.contract.address import DNS_SCHEME, FILE_SCHEME, DiscoveryError, parse_target
from atgrpo.contract.trainer import CAP_OFF_STALE, UPDATE_BOUNDS
from atgrpo.memory_rollout import VLLM_LORA_RANKS

if TYPE_CHECKING:
    from atgrpo.config import PoolConfig, RunConfig, RunSection
    from atgrpo.contract.sampling import Sampling

_RUN_NAME = re.compile(r"^[a-z0-9_-]+$")
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_HUB_PREFIXES = ("http://", "https://", "hf://")
_TINY_MODEL_HINT = "e.g. one built with `atgrpo model tiny --out DIR`"


def validate(cfg: RunConfig, bad: list[str]) -> Errors:
    """Every value out of range and every cross-field rule broken; `bad`: fields already wrong."""
    c = Checks(bad)
    _check_run(c, cfg.run)
    _check_env_and_agents(c, cfg)
    _check_pools(c, cfg)
    c.limits("algorithm", cfg.algorithm, {"k": AT_LEAST_1})
    # The trainer's own bounds (UPDATE_BOUNDS) on the update's settings (written flat there).
    update = cfg.algorithm.update
    c.limits("algorithm", update, _update_bounds(update))
    c.limits("algorithm", update.loss, _update_bounds(update.loss))
    _check_algorithm_names(c, cfg)
    _check_services(c, cfg)
    return c.errors


def _update_bounds(obj: object) -> dict:
    return {k: bound for k, bound in UPDATE_BOUNDS.items() if hasattr(obj, k)}


def _check_algorithm_names(c: Checks, cfg: RunConfig) -> None:
    from atgrpo.algo import registry

    alg = cfg.algorithm
    try:
        registry.adv_estimator(alg.grouping)  # an entry point may register it
    except KeyError:
        c.add(
            "algorithm.grouping",
            _unregistered(
                alg.grouping,
                registry.estimator_names(),
                "register_adv_est",
                registry.ADVANTAGE_GROUP,
            ),
        )
    try:
        loss = registry.policy_loss_named(alg.update.loss.policy_loss)
    except KeyError:
        c.add(
            "algorithm.policy_loss",
            _unregistered(
                alg.update.loss.policy_loss,
                registry.loss_names(),
                "register_policy_loss",
                registry.LOSS_GROUP,
            ),
        )
        return
    stale = [p for p in cfg.pools if cfg.max_staleness(p) > 0]
    if stale and alg.update.loss.behav_imp_cap == 0:
        c.add(
            "algorithm.behav_imp_cap",
            CAP_OFF_STALE.format(staleness=max(cfg.max_staleness(p) for p in stale))
            + f" (pools {', '.join(stale)})",
        )
    if stale and not loss.proximal and loss.name != "ppo_clip":
        c.add(
            "algorithm.policy_loss",
            f"{loss.name!r} does not take the proximal log-probs that asynchronous "
            f"training needs (max_staleness > 0 on pools {', '.join(stale)}); set max_staleness: "
            f"0, or "
            "register the loss with proximal=True",
        )


def _check_run(c: Checks, run: RunSection) -> None:
    if not _RUN_NAME.match(run.name):
        better = re.sub(r"[^a-z0-9_-]+", "-", run.name.lower()).strip("-") or "my-run"
        c.add("run.name", f"{run.name!r} must use only a-z, 0-9, '-' and '_'. Try {better!r}")
    c.limits(
        "run",
        run,
        {
            "steps": AT_LEAST_1,
            "tasks_per_step": AT_LEAST_1,
            "eval_every_steps": NON_NEG,
            "checkpoint_every_steps": NON_NEG,
            "eval_tasks": NON_NEG,
            "keep_checkpoints": NON_NEG,
        },
    )
    if run.eval_every_steps > 0 and run.eval_tasks == 0:
        c.add(
            "run.eval_tasks",
            "must be at least 1 when eval_every_steps > 0, got 0. "
            "Set eval_tasks: 1 or more, or eval_every_steps: 0 to never evaluate",
        )


def _check_env_and_agents(c: Checks, cfg: RunConfig) -> None:
    env, agents, order = cfg.env, cfg.agents, cfg.env.turn_order
    if not env.name:
        c.add("env.name", "is empty. Give a registered environment name")
    c.limits("env", env, {"max_turns": AT_LEAST_1})
    module, sep, cls = env.path.partition(":")
    if env.path and not (sep and module and cls):
        c.add(
            "env.path",
            f"is {env.path!r}. Write it as 'package.module:ClassName', e.g. "
            f"'my_envs.relay:RelayEnv'",
        )
    if cfg.algorithm.parallel_credit == "all_pairs" and not env.parallel:
        c.add(
            "algorithm.parallel_credit",
            "is all_pairs, which credits the joint actions of parallel turns, but env.parallel is "
            "false: set env.parallel: true for an env whose agents act at once, or leave "
            "parallel_credit at paired",
        )
    for split in ("train_split", "eval_split"):
        if not getattr(env, split):
            c.add(f"env.{split}", "is empty. Name a task split, e.g. 'train' or 'eval'")
    if not order:
        c.add(
            "env.turn_order",
            "is empty. List the agents in the order they act, e.g. [planner, coder]",
        )
    for i, name in enumerate(order):
        if name in order[:i]:
            c.add(
                f"env.turn_order[{i}]",
                f"agent {name!r} is listed twice. List each agent "
                "once (the order repeats every turn)",
            )
        elif name not in agents:
            hint = did_you_mean(name, agents)
            c.add(
                f"env.turn_order[{i}]",
                f"agent {name!r} is not defined.{hint} Add it under "
                "agents: or remove it from turn_order",
                uses=("agents",),
            )
    if not agents:
        c.add(
            "agents",
            "no agents are defined. Add one entry per name in env.turn_order, "
            "e.g. agents: {solver: {pool: main}}",
        )
    for name, agent in agents.items():
        path = f"agents.{name}"
        c.name(path, name, "agent")
        if order and name not in order:  # an empty turn_order is reported once, above
            c.add(
                path,
                "is not in env.turn_order, so it would never act. Add it to "
                "env.turn_order or remove it",
                uses=("env.turn_order",),
            )
        if agent.pool not in cfg.pools:
            hint = did_you_mean(agent.pool, cfg.pools)
            c.add(
                f"{path}.pool",
                f"no pool named {agent.pool!r}.{hint} Use one of the pools "
                f"defined: {choices_text(cfg.pools)}",
                uses=("pools",),
            )
        for which in ("train_sampling", "eval_sampling"):
            _check_sampling(c, f"{path}.{which}", getattr(agent, which))


def _check_sampling(c: Checks, path: str, sampling: Sampling) -> None:
    c.limits(
        path,
        sampling,
        {
            "temperature": (lambda v: v >= 0, ">= 0", "Use 0 for greedy decoding"),
            "top_p": (lambda v: 0 < v <= 1, "in (0, 1]", "Use 1.0 to turn top-p off"),
            "top_k": (lambda v: v == -1 or v >= 1, "-1 or at least 1", "Use -1 to turn top-k off"),
            "max_tokens": AT_LEAST_1,
            "max_prompt_tokens": AT_LEAST_1,
        },
    )
    for i, stop in enumerate(sampling.stop):
        if not stop:
            c.add(
                f"{path}.stop[{i}]",
                "is an empty string. Remove it (an empty stop string "
                "would end every response at once)",
            )


def _check_pools(c: Checks, cfg: RunConfig) -> None:
    if not cfg.pools:
        c.add(
            "pools",
            "no pools are defined. Add one, e.g. pools: {main: {model_path: DIR}}, "
            + _TINY_MODEL_HINT,
        )
    used = {a.pool for a in cfg.agents.values()}
    for name, pool in cfg.pools.items():
        path = f"pools.{name}"
        c.name(path, name, "pool")
        if not pool.model_path:
            c.add(
                f"{path}.model_path", "is empty. Give a local model directory, " + _TINY_MODEL_HINT
            )
        elif pool.model_path.startswith(_HUB_PREFIXES):
            c.add(
                f"{path}.model_path",
                f"{pool.model_path!r} is a URL, but no model hub is "
                f"reachable. Give a local directory instead, {_TINY_MODEL_HINT}",
            )
        if pool.specialization == "full" and pool.lora is not None:
            c.add(
                f"{path}.lora",
                "is set but specialization is 'full'. Set specialization: lora "
                "or remove the lora block",
                uses=(f"{path}.specialization",),
            )
        elif pool.lora is not None:
            c.limits(
                f"{path}.lora",
                pool.lora,
                {
                    "rank": AT_LEAST_1,
                    "alpha": (lambda v: v > 0, "> 0", "The usual value is 2 * rank"),
                    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)", "Use 0.0 for no dropout"),
                    "target_modules": (
                        bool,
                        "non-empty",
                        "List module names, e.g. [q_proj, v_proj]",
                    ),
                },
            )
            if pool.engine == "vllm" and pool.lora.rank > VLLM_LORA_RANKS[-1]:
                c.add(
                    f"{path}.lora.rank",
                    f"is {pool.lora.rank}, over the largest rank vLLM serves "
                    f"({VLLM_LORA_RANKS[-1]}). Use a rank of at most {VLLM_LORA_RANKS[-1]}, or "
                    f"engine: hf",
                    uses=(f"{path}.engine",),
                )
        c.limits(
            path,
            pool,
            {
                "rollout_replicas": AT_LEAST_1,
                "micro_batch_tokens": AT_LEAST_1,
                "trainer_gpus": AT_LEAST_1,
                "rollout_gpus": AT_LEAST_1,
            },
        )
        _check_gpus(c, path, pool)
        if pool.max_staleness is not None:  # else algorithm.max_staleness, checked there
            c.limits(path, pool, {"max_staleness": UPDATE_BOUNDS["max_staleness"]})
        c.limits(
            f"{path}.optim",
            pool.optim,
            {
                "lr": (lambda v: v > 0, "> 0", "Typical values are 1e-6 (full) to 1e-4 (lora)"),
                "weight_decay": NON_NEG,
                "warmup_steps": NON_NEG,
                "min_lr_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]", "Use 1.0 for a constant lr"),
                "grad_clip": (lambda v: v > 0, "> 0", "The usual value is 1.0"),
                "betas": (
                    lambda v: all(0 <= b < 1 for b in v),
                    "two values in [0, 1)",
                    "The usual values are [0.9, 0.999]",
                ),
            },
        )
        if name not in used:
            c.add(
                path,
                "no agent uses this pool. Point an agent's pool: at it or remove it",
                uses=("agents",),
            )


def _check_gpus(c: Checks, path: str, pool: PoolConfig) -> None:
    """The GPUs a pool states it is sized for (what `atgrpo plan` checks it against)."""
    if pool.gpu_memory and parse_bytes(pool.gpu_memory) is None:
        c.add(
            f"{path}.gpu_memory",
            f"{pool.gpu_memory!r} is not a memory size. Write a number with "
            "its unit, e.g. 80GiB or 141GiB (GB = 10^9 bytes, GiB = 2^30)",
        )
    if pool.device == "cpu":
        for key, value, unset in (
            ("trainer_gpus", pool.trainer_gpus, 1),
            ("gpu_memory", pool.gpu_memory, ""),
        ):
            if value != unset:
                c.add(
                    f"{path}.{key}",
                    f"is {value!r} but the pool runs on device: cpu. Set device: cuda, "
                    f"or remove {key}",
                    uses=(f"{path}.device",),
                )
    _check_rollout_gpus(c, path, pool)
    if pool.trainer_gpus > 1 and not pool.trainable:
        c.add(
            f"{path}.trainer_gpus",
            f"is {pool.trainer_gpus} but the pool is not trainable (no trainer). "
            "Remove trainer_gpus, or set trainable: true",
            uses=(f"{path}.trainable",),
        )


def _check_rollout_gpus(c: Checks, path: str, pool: PoolConfig) -> None:
    """Tensor parallelism and a memory fraction are vLLM's: transformers runs on one device, as it
    finds it."""
    if pool.rollout_gpus > 1 and pool.engine != "vllm":
        c.add(
            f"{path}.rollout_gpus",
            f"is {pool.rollout_gpus} but engine is {pool.engine!r}, which runs on one "
            "GPU. Set engine: vllm (tensor parallel over the GPUs), or rollout_gpus: 1",
            uses=(f"{path}.engine",),
        )
    if pool.rollout_gpus > 1 and pool.device == "cpu":
        c.add(
            f"{path}.rollout_gpus",
            f"is {pool.rollout_gpus} but the pool runs on device: cpu. Set device: cuda, "
            "or remove rollout_gpus",
            uses=(f"{path}.device",),
        )
    fraction = pool.rollout_gpu_memory_utilization
    if fraction is None:
        return
    if not 0 < fraction <= 1:
        c.add(
            f"{path}.rollout_gpu_memory_utilization",
            f"is {fraction}; give a fraction in (0, 1], e.g. 0.5 for "
            "half of each GPU, or remove it for vLLM's default",
        )
    elif pool.engine != "vllm":
        c.add(
            f"{path}.rollout_gpu_memory_utilization",
            f"is set but engine is {pool.engine!r}, which takes no "
            "memory fraction. Remove it, or set engine: vllm",
            uses=(f"{path}.engine",),
        )


def _unregistered(name: str, known: list[str], decorator: str, group: str) -> str:
    return (
        f"{name!r} must be one of {choices_text(known)}.{did_you_mean(name, known)} Or register it "
        f"with @{decorator}({name!r}) in a module the router imports (entry point group {group!r})"
    )


def _check_services(c: Checks, cfg: RunConfig) -> None:
    s = cfg.services
    singles = ("env", "sandbox", "router")
    addresses = [(f"services.{k}", getattr(s, k)) for k in singles if getattr(s, k)]
    for kind, table in (("rollout", s.rollout), ("trainer", s.trainer)):
        for pool, value in table.items():
            path = f"services.{kind}.{pool}"
            if pool not in cfg.pools:
                c.add(
                    path,
                    f"no pool named {pool!r}.{did_you_mean(pool, cfg.pools)} Use one of "
                    f"the pools defined: {choices_text(cfg.pools)}",
                    uses=("pools",),
                )
            if kind == "trainer":
                addresses.append((path, value))
            elif not value:
                c.add(
                    path,
                    "is an empty list. List at least one rollout address host:port, "
                    "or remove the key",
                )
            else:
                for i, a in enumerate(value):
                    if a.strip().startswith((DNS_SCHEME, FILE_SCHEME)):
                        # a pool's replicas as they come and go (atgrpo.discovery)
                        try:
                            parse_target(a)
                        except DiscoveryError as err:
                            c.add(f"{path}[{i}]", str(err))
                    else:
                        addresses.append((f"{path}[{i}]", a))
    for path, address in addresses:
        m = _ADDRESS.match(address)
        if not m or not 1 <= int(m.group(2)) <= 65535:
            c.add(
                path,
                f"{address!r} is not a host:port address. Write it like "
                "'localhost:50051' or 'router.atgrpo.svc:50051'",
            )
    if cfg.local_mode:
        return
    missing = [f"services.{k}" for k in singles if not getattr(s, k)]
    missing += [f"services.rollout.{p}" for p in cfg.pools if p not in s.rollout]
    missing += [
        f"services.trainer.{p}"
        for p, pool in cfg.pools.items()
        if pool.trainable and p not in s.trainer
    ]
    if missing:
        c.add(
            "services",
            f"{', '.join(missing)} not set: either give every service address "
            "or none (none = local mode, where atgrpo starts the services itself)",
        )

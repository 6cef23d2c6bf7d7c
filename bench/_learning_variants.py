"""bench/real_learning.py's tasks and variants (bench/paper_table.py runs them all): what each
task asks of its env, and where each variant's policies live and how it groups."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task of the learning benches: the env and its options, the team's turn order, L0's
    one agent, each agent's token limit, and whether every variant starts from a warm start
    (the base model fine-tuned on the env's own demonstrations: tasks SmolLM2 starts at 0 on)."""

    options: dict[str, Any]
    env: str = "reasoning_gym"
    team: tuple[str, ...] = ("tool", "reasoner")
    single: str = "reasoner"
    max_turns: int = 1
    # a short program; a sentence and the tagged answer
    max_tokens: dict[str, int] = field(default_factory=lambda: {"tool": 96, "reasoner": 64})
    warm_start: bool = False
    # the train episodes whose solver demonstrations make the warm start (0: paper_table's
    # --warm-episodes); fewer demonstrations, a weaker start
    warm_episodes: int = 0


def arithmetic(digits: int, operators: list[str]) -> dict[str, Any]:
    return {
        "dataset": "basic_arithmetic",
        "dataset_config": {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": digits,
            "max_digits": digits,
            "operators": operators,
            "allow_parentheses": False,
            "allow_negation": False,
        },
    }


TASKS: dict[str, Task] = {
    "arithmetic": Task(arithmetic(1, ["+", "-"])),
    # issue 56's harder one: three-digit numbers and a product, which the tool's program computes
    # and the reasoner alone does not
    "arithmetic3": Task(arithmetic(3, ["+", "-", "*"])),
    # the team did not learn it from cold (docs/results.md): warm-started
    "letters": Task(
        {"dataset": "letter_counting", "dataset_config": {"min_words": 5, "max_words": 8}},
        warm_start=True,
    ),
    # the paper's planning workflow on a small grid: the tool agent's program searches it, the
    # plan agent gives the moves; up to 3 turns. SmolLM2 writes no BFS from cold: warm-started.
    "plan_path": Task(
        {"grid_size": 5, "wall_ratio": 0.2},
        env="plan_path",
        team=("tool", "plan"),
        single="plan",
        max_turns=3,
        max_tokens={"tool": 384, "plan": 48},  # its BFS demonstration is 329 tokens
        warm_start=True,
    ),
}
# Plan-Path from a weaker start: 200 episodes' demonstrations leave the team at 1.000 before any
# RL, 20 at 0.000 (out of format), 60 at 0.047: room for the grouping ablation to show a difference
# on the one task of several turns. From 60, every program of the tool's failed alike (its groups
# had no variance to learn from); from 100 the team is still at 0.047 and 182 of the tool's 188
# answers pay -1 (measured once, not yet run as cells).
TASKS["plan_path_w60"] = dataclasses.replace(TASKS["plan_path"], warm_episodes=60)
TASKS["plan_path_w100"] = dataclasses.replace(TASKS["plan_path"], warm_episodes=100)
VARIANTS = ("at-grpo", "trajectory", "L0", "trl")
# The paper's other variants (bench/paper_table.py): where each role's policy lives, and the
# grouping ablation on the same tree samples (atgrpo.algo.estimators)
POLICY_VARIANTS = ("L2", "L3")  # a LoRA adapter per role on one base; a model per role
GROUPING = {
    "trajectory": "trajectory",
    "by-task": "task",
    "by-task-agent": "task_agent",
    "by-task-turn": "task_turn",
    "turn-loo": "turn_loo",
}
LORA = {"rank": 16, "alpha": 32.0}  # on the attention projections (the default target_modules)
LORA_LR = 3e-4  # not tuned: 10x the full weights' 3e-5, LoRA's usual ratio
ALL_VARIANTS = VARIANTS + POLICY_VARIANTS + tuple(v for v in GROUPING if v not in VARIANTS)


def pools_of(
    variant: str, agents: list[str], model: str, dtype: str, lr: float, min_lr_ratio: float = 1.0
) -> dict:
    """One shared model (L1, and L0's one agent); with L2 a LoRA adapter per role on it; with L3
    a model per role, each pool named after its agent. The learning rate is constant unless
    min_lr_ratio < 1 (a cosine decay over the run's steps to that fraction)."""
    # 4096 tokens a micro-batch: ~2 MB of float32 activations a position for SmolLM2 (measured),
    # so the default 8192 peaks near 20 GB and, beside the rollout, OOMs a 24 GB machine.
    pool: dict[str, Any] = {
        "model_path": model,
        "engine": "hf",
        "device": "cpu",
        "dtype": dtype,
        "micro_batch_tokens": 4096,
        "optim": {"lr": lr, "warmup_steps": 0, "min_lr_ratio": min_lr_ratio},
    }
    if variant == "L3":
        return {"pools": {a: pool for a in agents}}
    if variant == "L2":
        lora = {"specialization": "lora", "lora": LORA}
        return {"pools": {"shared": {**pool, **lora, "optim": {**pool["optim"], "lr": LORA_LR}}}}
    return {"pools": {"shared": pool}}

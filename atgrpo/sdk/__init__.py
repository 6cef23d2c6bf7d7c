"""The environment SDK: write a multi-agent task once, serve it to atgrpo over gRPC.

from atgrpo.sdk import Environment, EnvSpec, StepResult
"""

from atgrpo.sdk.env import (
    EVAL_SEED_OFFSET,
    Environment,
    EnvSpec,
    Message,
    Sandbox,
    StepResult,
    seed_for,
    task_rng,
    turn_order_option,
)

__all__ = [
    "EVAL_SEED_OFFSET",
    "EnvSpec",
    "Environment",
    "Message",
    "Sandbox",
    "StepResult",
    "seed_for",
    "task_rng",
    "turn_order_option",
]

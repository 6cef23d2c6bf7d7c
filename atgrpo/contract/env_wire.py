"""Protobuf <-> the env contract types (atgrpo.contract.env) for the EnvService."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2

from atgrpo._proto.v1 import common_pb2, env_pb2
from atgrpo.contract.env import EnvSpec, Message, StepResult
from atgrpo.errors import InvalidArgument


def struct_from(d: Mapping[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if d:
        s.update(dict(d))
    return s


def _ints(value: Any) -> Any:
    # Struct carries every number as a double; whole numbers were ints (max_turns, sizes).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def dict_from(s: struct_pb2.Struct, what: str = "options") -> dict[str, Any]:
    try:
        return _ints(json_format.MessageToDict(s))
    except ValueError as err:  # NaN or an infinity: JSON cannot carry them
        raise InvalidArgument(
            f"{what} holds a value JSON cannot carry ({err}); send plain JSON values: "
            "finite numbers, strings, bools, lists and mappings"
        ) from None


def spec_to_pb(spec: EnvSpec) -> env_pb2.EnvSpec:
    return env_pb2.EnvSpec(
        name=spec.name,
        agents=spec.agents,
        turn_order=spec.turn_order,
        parallel=spec.parallel,
        max_turns=spec.max_turns,
        description=spec.description,
        splits=spec.splits,
    )


def spec_from_pb(m: env_pb2.EnvSpec) -> EnvSpec:
    return EnvSpec(
        name=m.name,
        agents=tuple(m.agents),
        turn_order=tuple(m.turn_order),
        max_turns=m.max_turns,
        parallel=m.parallel,
        description=m.description,
        splits=tuple(m.splits),
    )


def messages_to_pb(messages: list[Message]) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages]


def messages_from_pb(ms) -> list[Message]:
    return [{"role": m.role, "content": m.content} for m in ms]


def step_to_pb(r: StepResult) -> env_pb2.StepResult:
    return env_pb2.StepResult(
        team_reward=r.team_reward,
        local_reward=r.local_reward,
        done=r.done,
        success=r.success,
        turn=r.turn,
        info=struct_from(r.info),
    )


def step_from_pb(m: env_pb2.StepResult) -> StepResult:
    return StepResult(
        team_reward=m.team_reward,
        local_reward=m.local_reward,
        done=m.done,
        success=m.success,
        info=dict_from(m.info),
        turn=m.turn,
    )

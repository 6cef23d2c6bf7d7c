"""What every service says of itself (GetInfo): which service, which build, which instance."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServiceInfo:
    service: str  # "env", "sandbox", "rollout", "router", "trainer"
    version: str = ""  # atgrpo package version
    instance: str = ""  # host:pid, to tell replicas apart
    started_unix_ms: int = 0
    details: dict[str, str] = field(default_factory=dict)  # engine, backend, pool ...

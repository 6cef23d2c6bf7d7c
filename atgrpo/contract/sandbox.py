"""Plain types of the sandbox: what to run, within which limits, and what came of it.

Protobuf stops at the servicer and the client (DESIGN.md §3); backends and the executor see these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Verdict(enum.Enum):
    OK = "ok"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    KILLED = "killed"


@dataclass(frozen=True)
class Limits:
    """Per-execution bounds. The server fills unset (0) fields from its defaults."""

    wall_timeout_ms: int = 10_000
    cpu_time_ms: int = 10_000
    memory_bytes: int = 512 * 2**20  # address space
    max_output_bytes: int = 2**20  # per stream
    max_processes: int = 64
    max_file_bytes: int = 16 * 2**20
    max_open_files: int = 64


# What a client sends to mean "the server's defaults" for every limit.
SERVER_DEFAULTS = Limits(0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class ExecRequest:
    language: str
    code: str
    stdin: bytes = b""
    files: tuple[tuple[str, bytes], ...] = ()  # (relative path, content)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class ExecResult:
    verdict: Verdict
    exit_code: int = 0
    signal: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_ms: int = 0
    cpu_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


class Compare(enum.Enum):
    EXACT = "exact"
    WHITESPACE = "whitespace"
    FLOAT = "float"


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest test class

    stdin: bytes
    expected_stdout: bytes


@dataclass(frozen=True)
class TestsRequest:
    __test__ = False  # not a pytest test class

    language: str
    code: str
    cases: tuple[TestCase, ...]
    compare: Compare = Compare.WHITESPACE
    float_tolerance: float = 1e-6
    limits: Limits = field(default_factory=Limits)
    stop_on_first_failure: bool = False


@dataclass(frozen=True)
class CaseResult:
    passed: bool
    execution: ExecResult | None  # None when skipped
    skipped: bool = False


@dataclass(frozen=True)
class TestsResult:
    __test__ = False  # not a pytest test class

    cases: tuple[CaseResult, ...]

    @property
    def passed(self) -> int:
        return sum(c.passed for c in self.cases)

    @property
    def pass_ratio(self) -> float:
        return self.passed / len(self.cases) if self.cases else 0.0

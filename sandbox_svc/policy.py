"""What the server accepts: request bounds, limit defaults and ceilings, and their validation.

A request outside these bounds is refused with INVALID_ARGUMENT naming the field and the bound,
before any work is queued, so a bad request cannot take a worker slot.
"""

from __future__ import annotations

import dataclasses
import posixpath
from dataclasses import dataclass, field

from atgrpo.contract.sandbox import ExecRequest, Limits, TestsRequest
from atgrpo.errors import InvalidArgument
from sandbox_svc.languages import LANGUAGES


@dataclass(frozen=True)
class Policy:
    defaults: Limits = field(default_factory=Limits)
    ceilings: Limits = field(
        default_factory=lambda: Limits(
            wall_timeout_ms=300_000,
            cpu_time_ms=300_000,
            memory_bytes=8 * 2**30,
            # 16 MiB a stream: both streams of one Execute fit in a 64 MiB gRPC message with room to
            # spare.
            max_output_bytes=16 * 2**20,
            max_processes=1024,
            max_file_bytes=2**30,
            max_open_files=4096,
        )
    )
    max_code_bytes: int = 2**20
    max_stdin_bytes: int = 16 * 2**20
    max_files: int = 64
    max_files_bytes: int = 16 * 2**20
    max_cases: int = 1024
    # RunTests keeps at most this much of all its cases' stdout and stderr together (later cases'
    # outputs are cut, flagged truncated; each verdict is judged on the whole output first):
    # 1024 cases at 16 MiB would otherwise be a 32 GiB answer held in memory.
    max_tests_output_bytes: int = 32 * 2**20
    tmp_bytes: int = 64 * 2**20  # size of the private /tmp each execution gets


def resolve_limits(asked: Limits | None, policy: Policy, where: str = "limits") -> Limits:
    """Fill unset (0) limits from the defaults; refuse negative values and values over the
    ceiling."""
    if asked is None:
        return policy.defaults
    values = {}
    for f in dataclasses.fields(Limits):
        v, ceiling = getattr(asked, f.name), getattr(policy.ceilings, f.name)
        if v < 0:
            raise InvalidArgument(
                f"{where}.{f.name} is {v}: limits cannot be negative; use 0 for the default "
                f"({getattr(policy.defaults, f.name)})"
            )
        if v > ceiling:
            raise InvalidArgument(
                f"{where}.{f.name} is {v}, over this server's ceiling of {ceiling}; "
                "ask for less (or raise the ceiling in the server's policy)"
            )
        values[f.name] = v or getattr(policy.defaults, f.name)
    return Limits(**values)


def _check_program(language: str, code: str, policy: Policy) -> None:
    if language not in LANGUAGES:
        raise InvalidArgument(
            f"language {language!r} is not supported; use one of {sorted(LANGUAGES)}"
        )
    if not code.strip():
        raise InvalidArgument("code is empty; send the program's source text")
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > policy.max_code_bytes:
        raise InvalidArgument(
            f"code is {size} bytes, over the limit of {policy.max_code_bytes}; "
            "send a smaller program or put data in files/stdin"
        )
    if "\x00" in code:
        raise InvalidArgument("code contains a NUL byte, which no source file can; send text")


def _check_files(files: tuple[tuple[str, bytes], ...], policy: Policy) -> None:
    if len(files) > policy.max_files:
        raise InvalidArgument(f"{len(files)} files, over the limit of {policy.max_files}")
    total = sum(len(c) for _, c in files)
    if total > policy.max_files_bytes:
        raise InvalidArgument(
            f"files total {total} bytes, over the limit of {policy.max_files_bytes}"
        )
    seen = set()
    for path, _ in files:
        norm = posixpath.normpath(path) if path else ""
        if (
            not path
            or path.startswith("/")
            or norm.startswith("..")
            or "\x00" in path
            or norm in (".", "main.py")
        ):
            raise InvalidArgument(
                f"file path {path!r} must be relative, inside the working directory, "
                "and not main.py (the program itself); e.g. 'data/input.txt'"
            )
        if norm in seen:
            raise InvalidArgument(f"file path {path!r} is given twice")
        seen.add(norm)


def check_exec(req: ExecRequest, policy: Policy) -> ExecRequest:
    """The request with its limits resolved, or InvalidArgument saying what to change."""
    _check_program(req.language, req.code, policy)
    if len(req.stdin) > policy.max_stdin_bytes:
        raise InvalidArgument(
            f"stdin is {len(req.stdin)} bytes, over the limit of {policy.max_stdin_bytes}"
        )
    _check_files(req.files, policy)
    return dataclasses.replace(req, limits=resolve_limits(req.limits, policy))


def check_tests(req: TestsRequest, policy: Policy) -> TestsRequest:
    _check_program(req.language, req.code, policy)
    if not req.cases:
        raise InvalidArgument("no test cases; send at least one (stdin, expected_stdout) pair")
    if len(req.cases) > policy.max_cases:
        raise InvalidArgument(
            f"{len(req.cases)} cases, over the limit of {policy.max_cases}; split the request"
        )
    for i, case in enumerate(req.cases):
        if len(case.stdin) > policy.max_stdin_bytes:
            raise InvalidArgument(
                f"cases[{i}].stdin is {len(case.stdin)} bytes, over {policy.max_stdin_bytes}"
            )
    if not 0 <= req.float_tolerance < 1:
        raise InvalidArgument(
            f"float_tolerance {req.float_tolerance} must be in [0, 1); 0 means 1e-6"
        )
    return dataclasses.replace(
        req, limits=resolve_limits(req.limits, policy), float_tolerance=req.float_tolerance or 1e-6
    )

"""Protobuf <-> atgrpo.contract.sandbox, so the sandbox's logic and the environments never see
generated types."""

from __future__ import annotations

from atgrpo._proto.v1 import sandbox_pb2 as pb
from atgrpo.contract.sandbox import (
    CaseResult,
    Compare,
    ExecRequest,
    ExecResult,
    Limits,
    TestCase,
    TestsRequest,
    TestsResult,
    Verdict,
)

_VERDICT_TO_PB = {
    Verdict.OK: pb.VERDICT_OK,
    Verdict.RUNTIME_ERROR: pb.VERDICT_RUNTIME_ERROR,
    Verdict.TIMEOUT: pb.VERDICT_TIMEOUT,
    Verdict.MEMORY_LIMIT: pb.VERDICT_MEMORY_LIMIT,
    Verdict.OUTPUT_LIMIT: pb.VERDICT_OUTPUT_LIMIT,
    Verdict.KILLED: pb.VERDICT_KILLED,
}
_VERDICT_FROM_PB = {v: k for k, v in _VERDICT_TO_PB.items()}
_COMPARE_FROM_PB = {
    pb.COMPARE_UNSPECIFIED: Compare.WHITESPACE,
    pb.COMPARE_EXACT: Compare.EXACT,
    pb.COMPARE_WHITESPACE: Compare.WHITESPACE,
    pb.COMPARE_FLOAT: Compare.FLOAT,
}
_COMPARE_TO_PB = {
    Compare.EXACT: pb.COMPARE_EXACT,
    Compare.WHITESPACE: pb.COMPARE_WHITESPACE,
    Compare.FLOAT: pb.COMPARE_FLOAT,
}
_LIMIT_FIELDS = (
    "wall_timeout_ms",
    "cpu_time_ms",
    "memory_bytes",
    "max_output_bytes",
    "max_processes",
    "max_file_bytes",
    "max_open_files",
)


def limits_from_pb(m: pb.Limits) -> Limits:
    # 0 = "server default": the policy fills it in (policy.resolve_limits).
    return Limits(**{f: getattr(m, f) for f in _LIMIT_FIELDS})


def limits_to_pb(limits: Limits | None) -> pb.Limits:
    return pb.Limits(**{f: getattr(limits, f) for f in _LIMIT_FIELDS}) if limits else pb.Limits()


def exec_request_from_pb(m: pb.ExecuteRequest) -> ExecRequest:
    return ExecRequest(
        language=m.language,
        code=m.code,
        stdin=m.stdin,
        files=tuple((f.path, f.content) for f in m.files),
        limits=limits_from_pb(m.limits),
    )


def exec_request_to_pb(req: ExecRequest) -> pb.ExecuteRequest:
    return pb.ExecuteRequest(
        language=req.language,
        code=req.code,
        stdin=req.stdin,
        files=[pb.File(path=p, content=c) for p, c in req.files],
        limits=limits_to_pb(req.limits),
    )


def exec_result_to_pb(r: ExecResult) -> pb.ExecuteResponse:
    return pb.ExecuteResponse(
        verdict=_VERDICT_TO_PB[r.verdict],
        exit_code=r.exit_code,
        signal=r.signal,
        stdout=r.stdout,
        stderr=r.stderr,
        stdout_truncated=r.stdout_truncated,
        stderr_truncated=r.stderr_truncated,
        wall_ms=r.wall_ms,
        cpu_ms=r.cpu_ms,
    )


def exec_result_from_pb(m: pb.ExecuteResponse) -> ExecResult:
    return ExecResult(
        verdict=_VERDICT_FROM_PB[m.verdict],
        exit_code=m.exit_code,
        signal=m.signal,
        stdout=m.stdout,
        stderr=m.stderr,
        stdout_truncated=m.stdout_truncated,
        stderr_truncated=m.stderr_truncated,
        wall_ms=m.wall_ms,
        cpu_ms=m.cpu_ms,
    )


def tests_request_from_pb(m: pb.RunTestsRequest) -> TestsRequest:
    return TestsRequest(
        language=m.language,
        code=m.code,
        cases=tuple(TestCase(c.stdin, c.expected_stdout) for c in m.cases),
        compare=_COMPARE_FROM_PB.get(m.compare, Compare.WHITESPACE),
        float_tolerance=m.float_tolerance,
        limits=limits_from_pb(m.limits),
        stop_on_first_failure=m.stop_on_first_failure,
    )


def tests_request_to_pb(req: TestsRequest) -> pb.RunTestsRequest:
    return pb.RunTestsRequest(
        language=req.language,
        code=req.code,
        cases=[pb.TestCase(stdin=c.stdin, expected_stdout=c.expected_stdout) for c in req.cases],
        compare=_COMPARE_TO_PB[req.compare],
        float_tolerance=req.float_tolerance,
        limits=limits_to_pb(req.limits),
        stop_on_first_failure=req.stop_on_first_failure,
    )


def tests_result_to_pb(r: TestsResult) -> pb.RunTestsResponse:
    cases = [
        pb.CaseResult(
            passed=c.passed,
            skipped=c.skipped,
            execution=exec_result_to_pb(c.execution) if c.execution else None,
        )
        for c in r.cases
    ]
    return pb.RunTestsResponse(
        cases=cases, passed=r.passed, total=len(r.cases), pass_ratio=r.pass_ratio
    )


def tests_result_from_pb(m: pb.RunTestsResponse) -> TestsResult:
    return TestsResult(
        tuple(
            CaseResult(
                passed=c.passed,
                skipped=c.skipped,
                execution=exec_result_from_pb(c.execution) if c.HasField("execution") else None,
            )
            for c in m.cases
        )
    )

"""Request validation and output comparison: pure rules, pinned on hand-made cases."""

import pytest

from atgrpo.contract.sandbox import (
    SERVER_DEFAULTS,
    Compare,
    ExecRequest,
    Limits,
    TestCase,
    TestsRequest,
)
from atgrpo.errors import InvalidArgument
from sandbox_svc.compare import outputs_match
from sandbox_svc.policy import Policy, check_exec, check_tests

P = Policy()


@pytest.mark.parametrize(
    "req, message",
    [
        (ExecRequest("python", ""), "code is empty"),
        (ExecRequest("python", "   \n"), "code is empty"),
        (ExecRequest("python", "x" * (2**20 + 1)), "over the limit of 1048576"),
        (
            ExecRequest("cobol", "print(1)"),
            "language 'cobol' is not supported; use one of ['python']",
        ),
        (ExecRequest("python", "print(1)\x00"), "NUL byte"),
        (ExecRequest("python", "print(1)", stdin=b"x" * (16 * 2**20 + 1)), "stdin is"),
        (ExecRequest("python", "1", files=(("/etc/passwd", b""),)), "must be relative"),
        (ExecRequest("python", "1", files=(("../up", b""),)), "must be relative"),
        (ExecRequest("python", "1", files=(("main.py", b""),)), "not main.py"),
        (ExecRequest("python", "1", files=(("a", b""), ("./a", b""))), "given twice"),
        (
            ExecRequest("python", "1", limits=Limits(wall_timeout_ms=-1)),
            "limits.wall_timeout_ms is -1",
        ),
        (
            ExecRequest("python", "1", limits=Limits(memory_bytes=2**40)),
            "over this server's ceiling",
        ),
        (
            ExecRequest("python", "1", limits=Limits(wall_timeout_ms=10**9)),
            "over this server's ceiling",
        ),
    ],
)
def test_bad_requests_are_refused_with_a_message(req, message):
    with pytest.raises(InvalidArgument, match=None) as err:
        check_exec(req, P)
    assert message in str(err.value)


def test_unset_limits_take_the_server_defaults():
    req = check_exec(ExecRequest("python", "print(1)", limits=SERVER_DEFAULTS), P)
    assert req.limits == P.defaults
    req = check_exec(ExecRequest("python", "print(1)", limits=Limits(0, 500, 0, 0, 0, 0, 0)), P)
    assert (
        req.limits.cpu_time_ms == 500 and req.limits.wall_timeout_ms == P.defaults.wall_timeout_ms
    )


def test_tests_request_rules():
    with pytest.raises(InvalidArgument, match="no test cases"):
        check_tests(TestsRequest("python", "print(1)", ()), P)
    with pytest.raises(InvalidArgument, match="float_tolerance"):
        check_tests(
            TestsRequest("python", "print(1)", (TestCase(b"", b""),), float_tolerance=2.0), P
        )
    ok = check_tests(
        TestsRequest("python", "print(1)", (TestCase(b"", b"1"),), float_tolerance=0.0), P
    )
    assert ok.float_tolerance == 1e-6


@pytest.mark.parametrize(
    "actual, expected, mode, want",
    [
        (b"1 2\n", b"1 2\n", Compare.EXACT, True),
        (b"1 2", b"1 2\n", Compare.EXACT, False),
        (b"1  2 \n\n", b"1 2\n", Compare.WHITESPACE, True),
        (b"1 2 3", b"1 2", Compare.WHITESPACE, False),
        (b"12", b"1 2", Compare.WHITESPACE, False),
        (b"0.3333333", b"0.333333333", Compare.FLOAT, True),
        (b"0.34", b"0.333333333", Compare.FLOAT, False),
        (b"1000000.5", b"1000000.0", Compare.FLOAT, True),  # relative for large values
        (b"yes 0.5", b"yes 0.5000001", Compare.FLOAT, True),
        (b"no 0.5", b"yes 0.5", Compare.FLOAT, False),
        (b"nan", b"nan", Compare.FLOAT, True),
        (b"inf", b"1e308", Compare.FLOAT, False),
        (b"inf", b"inf", Compare.FLOAT, True),  # inf - inf is nan: equal only as infinities
        (b"-inf", b"inf", Compare.FLOAT, False),
        # integers are exact, whatever the tolerance
        (
            b"1000000008",
            b"1000000007",
            Compare.FLOAT,
            False,
        ),
        (b"1000000007.0000001", b"1000000007", Compare.FLOAT, True),
    ],
)
def test_outputs_match(actual, expected, mode, want):
    assert outputs_match(actual, expected, mode, 1e-6) is want

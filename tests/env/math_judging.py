"""What the math env's integrity suites (test_integrity_math.py, test_integrity_math_bounded.py,
test_integrity_math_env.py) share: the wall clock they hold each judge call to, and a fixture that
pays sympy's and mpmath's imports before any clock starts (imported into a suite, it is autouse
there)."""

import time

import pytest

from env_svc.envs.answers import answers_match

WALL_S = 2.0  # per judge call: generous, so that only real blow-ups fail
MB = 1 << 20


def timed(fn, *args):
    t = time.monotonic()
    try:
        return fn(*args)
    finally:
        assert time.monotonic() - t < WALL_S, (
            f"{fn.__name__} took {time.monotonic() - t:.1f}s on {args[0][:80]!r}"
        )


@pytest.fixture(scope="module", autouse=True)
def warm():
    answers_match("\\frac{1}{2}", "0.5")  # sympy's and mpmath's imports are not an attack

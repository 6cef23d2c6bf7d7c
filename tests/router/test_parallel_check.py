"""The run config and the environment's spec must agree on parallel turns."""

import pytest

from atgrpo.env_check import parallel_problem


@pytest.mark.parametrize("both", [True, False])
def test_agreement_is_no_problem(both):
    assert parallel_problem(both, both, "code") is None


def test_a_parallel_config_on_a_sequential_env_names_both_fixes():
    msg = parallel_problem(True, False, "code")
    assert "env.parallel is true" in msg and "'code'" in msg and "sequentially" in msg
    assert "set env.parallel: false" in msg and "env.options.parallel: true" in msg


def test_a_sequential_config_on_a_parallel_env_names_both_fixes():
    msg = parallel_problem(False, True, "max_digit")
    assert "env.parallel is false" in msg and "'max_digit'" in msg and "in parallel" in msg
    assert "set env.parallel: true" in msg and "env.options.parallel: false" in msg

"""--collective-timeout-s: how long a trainer rank waits for the others inside a pool operation
(trainer_svc/distributed.py). A finite default, settable by flag or environment, and refused, with
the fix named, when it is not a positive number of seconds. The fault hook's spec is checked as
strictly: a typo must not silently inject nothing."""

import argparse

import pytest

from atgrpo.rpc.main import SettingsError
from trainer_svc.distributed import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    FAULT_ENV,
    TIMEOUT_ENV,
    parse_fault,
)
from trainer_svc.settings import TrainerSettings


def settings(*argv: str) -> TrainerSettings:
    ap = argparse.ArgumentParser()
    TrainerSettings.add_flags(ap)
    return TrainerSettings.from_args(ap.parse_args(list(argv)))


def test_the_timeout_is_finite_by_default_and_set_by_flag_or_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert settings().collective_timeout_s == DEFAULT_COLLECTIVE_TIMEOUT_S == 900.0
    assert settings("--collective-timeout-s", "30").collective_timeout_s == 30.0
    monkeypatch.setenv(TIMEOUT_ENV, "90")
    assert settings().collective_timeout_s == 90.0
    assert settings("--collective-timeout-s", "45").collective_timeout_s == 45.0  # the flag wins


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused_naming_the_fix(bad):
    with pytest.raises(SettingsError, match=r"--collective-timeout-s .*: give the seconds .*> 0"):
        settings("--collective-timeout-s", bad)


def test_the_fault_hook_takes_only_its_own_rank_and_refuses_a_bad_spec():
    assert parse_fault("", 1) is None
    assert parse_fault("1:train:2:raise", 1) == ("train", 2, "raise")
    assert parse_fault("1:train:2:stall", 0) is None
    for bad in ("1:train:raise", "x:train:2:raise", "1:train:2:explode"):
        with pytest.raises(ValueError, match=f"{FAULT_ENV}=.*RANK:OP:NTH:raise|stall"):
            parse_fault(bad, 1)

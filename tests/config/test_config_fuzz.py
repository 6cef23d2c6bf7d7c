"""A valid run config with one random mistake (a wrong type, an unknown key, a number out of
range) anywhere in it always fails with a ConfigError that names the broken field."""

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atgrpo.config import ConfigError, load_yaml_config, parse_config
from tests.config.fuzz_configs import mutations, sites, valid_config

BASE = valid_config()
FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_the_base_config_is_valid_and_every_field_is_a_target():
    cfg = parse_config(BASE)
    assert cfg.run.name == "fuzz-run"
    dotted = {s.dotted for s in sites(BASE)}
    assert {
        "run.steps",
        "algorithm.k",
        "pools.shared.optim.lr",
        "agents.speaker.train_sampling.top_p",
        "env.options",
        "agents.listener.system_prompt",
    } <= dotted


@FUZZ
@given(mutation=mutations(BASE), as_yaml=st.booleans())
def test_a_config_with_one_mistake_gets_a_config_error_naming_the_field(mutation, as_yaml):
    data, field, kind = mutation
    try:
        if as_yaml:
            load_yaml_config(yaml.safe_dump(data, sort_keys=False), source="fuzz.yaml")
        else:
            parse_config(data, source="fuzz")
    except ConfigError as err:
        text = str(err)
        assert field in text, f"{kind} mistake at {field} was reported without naming it:\n{text}"
        assert field in {f for f, _ in err.errors} or any(
            f.startswith(field) for f, _ in err.errors
        ), err.errors
    else:
        raise AssertionError(f"{kind} mistake at {field} was accepted: {data}")

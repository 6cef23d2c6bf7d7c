"""`atgrpo config check` builds the config's environment in its own process (no services) and
checks its spec as the router does at the start of a run, with the router's message."""

import asyncio
import time
from types import SimpleNamespace

import pytest
import yaml

from atgrpo.cli import launcher, main
from atgrpo.config import parse_config
from atgrpo.errors import AtgrpoError
from router_svc.loop import RunLoop

# a third-party env that plays a then b, whatever it is told
CARELESS = "tests.env.sdk_envs:CarelessEnv"


def config(tmp_path, **env) -> dict:
    return {
        "run": {"name": "r", "run_dir": str(tmp_path / "run")},
        "env": {
            "name": "careless",
            "path": CARELESS,
            "turn_order": ["a", "b"],
            "max_turns": 2,
            **env,
        },
        "pools": {"shared": {"model_path": str(tmp_path / "model")}},
        "agents": {"a": {"pool": "shared"}, "b": {"pool": "shared"}},
    }


def check(tmp_path, data, monkeypatch) -> tuple[int, float]:
    def no_services(*args, **kwargs):
        raise AssertionError("config check started services")

    monkeypatch.setattr(launcher, "up", no_services)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    start = time.perf_counter()
    code = main(["config", "check", str(path)])
    return code, time.perf_counter() - start


def test_a_turn_order_the_env_does_not_play_fails_the_check_at_once(tmp_path, monkeypatch, capsys):
    code, took = check(tmp_path, config(tmp_path, turn_order=["b", "a"]), monkeypatch)
    out, err = capsys.readouterr()
    assert code == 2 and "ok" not in out
    assert (
        "InvalidArgument: env.turn_order is ['b', 'a'], but env 'careless' with these options acts "
        "in the order ['a', 'b']: make them the same"
    ) in err
    assert took < 1.0
    assert not (tmp_path / "run" / "services").exists()


def test_a_config_the_env_fits_is_ok(tmp_path, monkeypatch, capsys):
    code, _ = check(tmp_path, config(tmp_path), monkeypatch)
    assert code == 0 and "ok (L1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "env, says",
    [
        ({"max_turns": 5}, "env.max_turns is 5, over the 3 turns env 'careless' allows"),
        (
            {"parallel": True},
            "env.parallel is true, but env 'careless' with these options plays its turns "
            "sequentially",
        ),
        ({"name": "nope", "path": ""}, "no environment named 'nope'"),
        (
            {"path": "tests.env.no_such_module:Env"},
            "env 'careless' could not be loaded\nInvalidArgument: cannot load environment "
            "'tests.env.no_such_module:Env' (ModuleNotFoundError: No module named "
            "'tests.env.no_such_module'). Install the package that holds it",
        ),
        (
            {"name": "pair", "path": CARELESS},
            "env.name is 'pair', but env.path's class tests.env.sdk_envs.CarelessEnv is named "
            "'careless' (its `name`): set env.name: careless",
        ),
        (
            {"options": {"mode": "init_raises"}},
            "EnvCodeError: env 'careless' (tests.env.sdk_envs.CarelessEnv)",
        ),
    ],
    ids=[
        "max_turns",
        "parallel",
        "unknown_env",
        "bad_path",
        "name_not_the_class",
        "env_code_raises",
    ],
)
def test_every_problem_the_router_finds_is_found_here(env, says, tmp_path, monkeypatch, capsys):
    code, _ = check(tmp_path, config(tmp_path, **env), monkeypatch)
    assert code == 2 and says in capsys.readouterr().err


def test_a_builtin_env_is_built_and_checked(tmp_path, monkeypatch, capsys):
    data = config(tmp_path, name="toy", path="", turn_order=["speaker", "listener"], max_turns=9)
    data["agents"] = {"speaker": {"pool": "shared"}, "listener": {"pool": "shared"}}
    code, _ = check(tmp_path, data, monkeypatch)
    assert (
        code == 2
        and "env.max_turns is 9, over the 2 turns env 'toy' allows" in capsys.readouterr().err
    )


def test_an_env_served_elsewhere_is_left_to_the_router(tmp_path, monkeypatch, capsys):
    data = config(tmp_path, name="remote_only", path="")
    data["services"] = {
        "env": "envs:1",
        "sandbox": "s:1",
        "router": "r:1",
        "rollout": {"shared": ["ro:1"]},
        "trainer": {"shared": "t:1"},
    }
    code, _ = check(tmp_path, data, monkeypatch)
    out, err = capsys.readouterr()
    assert code == 0 and "ok (L1" in out and "the router checks it" in err


def test_an_env_path_for_another_machine_is_left_to_the_router_in_connect_mode(
    tmp_path, monkeypatch, capsys
):
    data = config(tmp_path, path="only_on_the_cluster.envs:Env")
    data["services"] = {
        "env": "envs:1",
        "sandbox": "s:1",
        "router": "r:1",
        "rollout": {"shared": ["ro:1"]},
        "trainer": {"shared": "t:1"},
    }
    assert check(tmp_path, data, monkeypatch)[0] == 0
    assert "the router checks it" in capsys.readouterr().err


@pytest.mark.parametrize(
    "env",
    [{"turn_order": ["b", "a"]}, {"max_turns": 5, "parallel": True}, {"name": "nope", "path": ""}],
    ids=["turn_order", "two_problems", "unknown_env"],
)
def test_the_router_gives_the_same_message(env, tmp_path, monkeypatch, capsys):
    """The router's check (Describe from the env service, here answered by the env service's own
    registry in this process) fails the run with the message `atgrpo config check` prints."""
    from atgrpo.sdk.host import EnvHost
    from env_svc.server import builtin_registry

    cfg = parse_config(
        config(tmp_path, **env)
        | {
            "services": {
                "env": "e:1",
                "sandbox": "s:1",
                "router": "r:1",
                "rollout": {"shared": ["ro:1"]},
                "trainer": {"shared": "t:1"},
            }
        }
    )
    host = EnvHost(builtin_registry({cfg.env.name: cfg.env.path} if cfg.env.path else {}))

    class EnvService:
        async def describe(self, name, options):
            return host.describe(name, options)

    with pytest.raises(AtgrpoError) as router:
        asyncio.run(RunLoop(cfg, clients=SimpleNamespace(env=EnvService())).check_env())
    assert check(tmp_path, config(tmp_path, **env), monkeypatch)[0] == 2
    assert capsys.readouterr().err.endswith(
        f"\n{type(router.value).__name__}: {router.value.message}\n"
    )


def test_a_load_failure_is_not_called_a_misfit_and_reads_as_sentences(
    tmp_path, monkeypatch, capsys
):
    check(tmp_path, config(tmp_path, path="tests.env.no_such_module:Env"), monkeypatch)
    err = capsys.readouterr().err
    assert "does not fit" not in err and "could not be loaded" in err
    assert "?" not in err and "right:" not in err  # no question turned into a colon
    assert "env.path is 'tests.env.no_such_module:Env'" in err


@pytest.mark.parametrize("command", ["train", "eval"])
def test_train_and_eval_fail_on_a_bad_env_path_in_seconds_with_no_service(
    command, tmp_path, monkeypatch, capsys
):
    """`atgrpo train` and `atgrpo eval` build the env in this process first (a user running from
    the wrong folder used to wait ~23 s for five services to start and one to fail)."""

    def no_services(*args, **kwargs):
        raise AssertionError(f"atgrpo {command} started services")

    monkeypatch.setattr(launcher, "up", no_services)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, path="wrong_folder.pair_sum:PairSumEnv")))
    start = time.perf_counter()
    code = main([command, str(path)])
    took = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2 and took < 5.0, (code, took)
    assert err.startswith(f"atgrpo {command}: {path}: env 'careless' could not be loaded\n"), err
    assert "No module named 'wrong_folder'" in err
    assert not (tmp_path / "run" / "services").exists()

"""Runs the router refuses, or that fail at their start, through the five services as real
processes: a bad config gets INVALID_ARGUMENT naming every problem, and a third-party env whose
spec disagrees with the config, or whose code raises, fails the run on its first attempt saying
why. None trains a step, so they share one set of services per module."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from atgrpo.cli.runner import LocalServices, drive
from atgrpo.config import dump_config, parse_config
from router_svc.client import RouterClient
from tests.e2e.toy_runs import Collect, toy_config

pytestmark = pytest.mark.slow


def careless_config(run_dir: Path, model: str, **env) -> dict:
    """The toy L1 config with a third-party env (env.path: hosted by the env service `atgrpo
    train` starts) whose spec the config may disagree with, or whose code may raise."""
    data = toy_config(run_dir, model, "L1")
    data["env"] = {
        "name": "careless",
        "path": "tests.env.sdk_envs:CarelessEnv",
        "turn_order": ["a", "b"],
        "max_turns": 2,
        **env,
    }
    data["agents"] = {a: {"pool": "a", "train_sampling": {"max_tokens": 4}} for a in ("a", "b")}
    return data


@pytest.fixture(scope="module")
def careless_services(tiny_model, tmp_path_factory):
    """One set of the five services for the runs that are refused or fail at their start: none of
    them trains a step, so none leaves anything the next one would see (8 s of start-up each)."""
    cfg = parse_config(careless_config(tmp_path_factory.mktemp("careless") / "run", tiny_model))
    with LocalServices(cfg) as running:
        yield running


@pytest.mark.xdist_group("careless")  # one worker, so the services start once
def test_bad_config_is_refused_by_the_router(careless_services):
    """StartRun answers INVALID_ARGUMENT with every config problem, and starts nothing."""
    from atgrpo.errors import InvalidArgument

    async def start(text: str):
        async with RouterClient(careless_services.services.router) as router:
            return await router.start_run(text)

    with pytest.raises(InvalidArgument, match="algorithm.k") as err:
        asyncio.run(start("run: {name: x}\nalgorithm: {k: 0}\n"))
    assert "env" in str(err.value)
    # valid, but names no services the router could reach
    local_mode = dump_config(careless_services, services=False)
    with pytest.raises(InvalidArgument, match="services: section is empty"):
        asyncio.run(start(local_mode))


@pytest.mark.xdist_group("careless")
@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"max_turns": 5},
            r"InvalidArgument: env.max_turns is 5, over the 3 turns env 'careless' allows",
        ),
        (
            {"turn_order": ["b", "a"]},
            r"env.turn_order is \['b', 'a'\], but env 'careless' .* acts in the order \['a', 'b'\]",
        ),
        (
            {"options": {"mode": "step_raises"}},
            r"EnvCodeError: env 'careless' \(tests\.env\.sdk_envs\.CarelessEnv\): step\('a', ...\) "
            r"raised ValueError: boom in step.*\(not retried",
        ),
        ({"name": "nope", "path": ""}, r"no environment named 'nope'.*set env.path"),
        (
            {"parallel": True},
            r"env.parallel is true, but env 'careless' with these options plays its turns "
            r"sequentially",
        ),
    ],
    ids=["max_turns", "turn_order", "env_code_raises", "unknown_env", "parallel"],
)
def test_a_run_that_cannot_work_fails_at_once_saying_why(
    env, message, careless_services, tiny_model, tmp_path
):
    """A third-party env whose spec disagrees with the config, or whose code raises, fails the run
    on its first attempt with the reason, instead of retrying a step that fails the same way every
    time."""
    import dataclasses
    import re

    cfg = parse_config(careless_config(tmp_path / "run", tiny_model, **env))
    cfg = dataclasses.replace(cfg, services=careless_services.services)
    sink = Collect()
    final = asyncio.run(drive(cfg, sink))
    assert final["state"] == "failed" and re.search(message, final["error"]), final
    assert not [e for e in sink.events if e["kind"] == "step"]
    logs = Path(careless_services.run.run_dir) / "services" / "logs"
    assert "recovering in" not in (logs / "router.log").read_text()  # no backoff, no retry

import pytest


@pytest.fixture(scope="module")
def sandbox():
    """A LocalSandbox over the bwrap backend, one per test module (what env_svc's envs run
    model-written programs in); fails, rather than skips, where bwrap cannot run."""
    from sandbox_svc.backends.base import BackendUnavailable
    from sandbox_svc.backends.bwrap import BwrapBackend
    from sandbox_svc.executor import Executor
    from sandbox_svc.inprocess import LocalSandbox
    from sandbox_svc.policy import Policy

    backend = BwrapBackend(Policy())
    try:
        backend.check()
    except BackendUnavailable as e:
        backend.close()
        pytest.fail(f"bwrap sandbox unavailable ({e}): `make install` installs bubblewrap")
    executor = Executor(backend, workers=2)
    yield LocalSandbox(executor)
    executor.close()


@pytest.fixture(scope="module", params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def isolated_sandbox(request):
    """A LocalSandbox over each isolated backend in turn (bwrap, docker): the integrity suites'
    judges must hold on both."""
    from sandbox_svc.backends.bwrap import BwrapBackend
    from sandbox_svc.backends.docker import DockerBackend
    from sandbox_svc.executor import Executor
    from sandbox_svc.inprocess import LocalSandbox
    from sandbox_svc.policy import Policy

    if request.param == "bwrap":
        backend = BwrapBackend(Policy())
    else:
        backend = DockerBackend(Policy(), client=request.getfixturevalue("docker_engine"))
    backend.check()
    executor = Executor(backend, workers=2)
    yield LocalSandbox(executor)
    executor.close()


def two_steps_of(example: str, model: str, run_dir) -> list[dict]:
    """examples/<example> trained two steps from `model` on local services: the run finishes,
    its pool updates twice, and every sample it saved comes back."""
    import asyncio
    import json

    import yaml

    from atgrpo.cli.runner import LocalServices, drive
    from atgrpo.config import parse_config
    from tests.conftest import ROOT
    from tests.e2e.toy_runs import Collect

    data = yaml.safe_load((ROOT / "examples" / example).read_text())
    data["run"].update(steps=2, eval_every_steps=0, run_dir=str(run_dir))
    data["pools"]["shared"]["model_path"] = str(model)
    sink = Collect()
    with LocalServices(parse_config(data)) as running:
        final = asyncio.run(drive(running, sink))
    assert final["state"] == "finished", final
    steps = [e for e in sink.events if e["kind"] == "step"]
    assert [e["pools"]["shared"]["version"] for e in steps] == [1, 2]
    return [
        json.loads(line)
        for f in sorted((run_dir / "samples").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def env_address(tmp_path_factory):
    """A real env service with a real sandbox service behind it, one per test module."""
    from atgrpo.cli import launcher

    plan = (
        launcher.ServiceProcess("sandbox", "sandbox"),
        launcher.ServiceProcess("env", "env", ("--sandbox", "{sandbox}")),
    )
    state = tmp_path_factory.mktemp("services")
    services = launcher.up(state, plan, timeout_s=60)
    yield next(s.address for s in services if s.name == "env")
    launcher.down(state)

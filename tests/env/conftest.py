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

import pytest

from tests.sandbox.docker_engine import engine_client


@pytest.fixture(scope="session")
def docker_engine():
    """A docker.DockerClient (tests/sandbox/docker_engine.py): one engine for every module of
    the session."""
    yield from engine_client()

"""Execution backends behind one interface (base.Backend): bwrap (default), docker, subprocess."""

from __future__ import annotations

from sandbox_svc.backends.base import Backend, BackendUnavailable
from sandbox_svc.policy import Policy

BACKENDS = ("bwrap", "docker", "subprocess")


def make_backend(
    name: str,
    policy: Policy,
    *,
    unsafe_no_isolation: bool = False,
    uid_base: int = 60000,
    docker_image: str | None = None,
) -> Backend:
    """The named backend, checked to work here; BackendUnavailable names the fix otherwise."""
    if name == "bwrap":
        from sandbox_svc.backends.bwrap import BwrapBackend

        backend: Backend = BwrapBackend(policy, uid_base=uid_base)
    elif name == "docker":
        from sandbox_svc.backends.docker import DockerBackend

        backend = DockerBackend(policy, image=docker_image)
    elif name == "subprocess":
        if not unsafe_no_isolation:
            raise BackendUnavailable(
                "the subprocess backend runs model-written code with NO isolation (it can read "
                "this machine's files and reach its network); pass --unsafe-no-isolation to accept "
                "that for local development, or use --backend bwrap"
            )
        from sandbox_svc.backends.unsafe import SubprocessBackend

        backend = SubprocessBackend(uid_base=uid_base)
    else:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    backend.check()
    return backend

"""A Docker engine for the docker backend's tests: the one already running, or a private dockerd.

`engine_client()` yields a `docker.DockerClient` (the session fixture `docker_engine` in
tests/sandbox/conftest.py, one engine for every module). It uses the engine at DOCKER_HOST
(or the default socket) when that answers; otherwise it starts `dockerd` on a socket of its own,
with vfs storage and no bridge or iptables (nothing it does needs a network), and stops it at the
end of the session. When no engine can be had it fails the tests with the reason: these tests
must run in CI, so a missing engine is an error, not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20


def _answering(base_url: str | None = None, timeout: int = 60):
    """A client of the engine at `base_url` (default: DOCKER_HOST or the default socket) if it
    answers, else None."""
    import docker

    try:  # the client asks the engine its API version when created
        client = (
            docker.DockerClient(base_url=base_url, timeout=timeout)
            if base_url
            else docker.from_env(timeout=timeout)
        )
    except Exception:  # noqa: BLE001 - any failure means "no engine there"
        return None
    try:
        if client.ping():
            return client
    except Exception:  # noqa: BLE001
        pass
    client.close()
    return None


def _dockerd() -> str:
    path = shutil.which("dockerd") or (
        "/usr/sbin/dockerd" if os.path.exists("/usr/sbin/dockerd") else None
    )
    if path:
        return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "docker.io"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=600,
            check=False,
        )
        path = shutil.which("dockerd")
        if path:
            return path
    pytest.fail(
        "no Docker engine answers (DOCKER_HOST or /var/run/docker.sock) and dockerd is not "
        "installed: apt-get install docker.io (as root), or start an engine and set DOCKER_HOST"
    )


class _PrivateEngine:
    """dockerd on its own socket, data root and exec root under one temporary directory."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            pytest.fail(
                "no Docker engine answers (DOCKER_HOST or /var/run/docker.sock), and starting a "
                "private dockerd needs root: start an engine and set DOCKER_HOST"
            )
        self.dockerd = _dockerd()
        # Short: the engine puts unix sockets under it, and those paths are limited to 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="atgrpo-dockerd-", dir="/tmp")
        self.socket = os.path.join(self.dir, "docker.sock")
        self.log_path = os.path.join(self.dir, "dockerd.log")
        config = os.path.join(self.dir, "daemon.json")
        with open(config, "w") as f:
            json.dump({}, f)  # not /etc/docker/daemon.json, whose settings could clash with ours
        argv = [
            self.dockerd,
            "--config-file",
            config,
            "--storage-driver=vfs",
            "--iptables=false",
            "--ip-masq=false",
            "--bridge=none",
            "--userland-proxy=false",
            "--log-level=warn",
            "--data-root",
            os.path.join(self.dir, "data"),
            "--exec-root",
            os.path.join(self.dir, "exec"),
            "--host",
            f"unix://{self.socket}",
            "--pidfile",
            os.path.join(self.dir, "docker.pid"),
        ]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(
                    f"dockerd exited with {self.proc.returncode} before "
                    f"answering:\n{self._log_tail()}"
                )
            client = _answering(f"unix://{self.socket}") if os.path.exists(self.socket) else None
            if client is not None:
                return client
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"dockerd did not answer within {START_TIMEOUT_S} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # its own session: dockerd and its containerd
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def engine_client() -> Iterator:
    try:
        import docker  # noqa: F401
    except ImportError:
        pytest.fail("the docker tests need the Docker SDK: pip install 'atgrpo[docker]'")
    existing = _answering()
    if existing is not None:
        yield existing
        existing.close()
        return
    engine = _PrivateEngine()
    client = engine.wait()
    try:
        yield client
    finally:
        try:  # what a test left running: dockerd would wait out each one's stop timeout
            for container in client.containers.list(all=True):
                container.remove(force=True)
        except Exception:  # noqa: BLE001 - stopping the engine clears them anyway
            pass
        client.close()
        engine.stop()

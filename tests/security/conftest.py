import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.security.pki import PKI, make_pki

TOKEN = "tok-3f9a1c0d7e-the-cluster-secret"


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_client_env(pki: PKI, *, cert: bool = True, token: str | None = TOKEN) -> dict[str, str]:
    """The ATGRPO_* variables a client (or a service calling others) reads."""
    env = {"ATGRPO_TLS_CA": pki.ca_pem}
    if cert:
        env |= {"ATGRPO_TLS_CERT": pki.client_pem, "ATGRPO_TLS_KEY": pki.client_key}
    if token:
        env["ATGRPO_AUTH_TOKEN"] = token
    return env


@pytest.fixture
def client_env(monkeypatch):
    """Set (or clear) the client variables for this test only."""
    for name in (
        "ATGRPO_TLS_CA",
        "ATGRPO_TLS_CERT",
        "ATGRPO_TLS_KEY",
        "ATGRPO_TLS_SERVER_NAME",
        "ATGRPO_AUTH_TOKEN",
        "ATGRPO_AUTH_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)

    def apply(values: dict[str, str]) -> None:
        for k, v in values.items():
            monkeypatch.setenv(k, v)

    return apply


@dataclass
class Proc:
    kind: str
    proc: subprocess.Popen
    address: str
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_service(
    kind: str, tmp: Path, args: list[str], env: dict[str, str], timeout_s: float = 90
) -> Proc:
    """`python -m <kind>_svc ARGS` with exactly `env` added to a clean environment; its log
    (stdout and stderr) goes to a file the test can read."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ATGRPO_")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    base["ATGRPO_LOG_LEVEL"] = "DEBUG"
    port_file, log = tmp / f"{kind}.port.json", tmp / f"{kind}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"{kind}_svc",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *args,
            ],
            env=base | env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None:
            raise AssertionError(
                f"{kind} exited {proc.returncode}:\n{log.read_text(errors='replace')}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(
                f"{kind} did not report its port:\n{log.read_text(errors='replace')}"
            )
        time.sleep(0.05)
    port = json.loads(port_file.read_text())["port"]
    return Proc(kind, proc, f"127.0.0.1:{port}", log)

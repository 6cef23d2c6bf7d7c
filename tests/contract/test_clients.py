"""A service's client is what its callers carry: importing all five in a fresh interpreter loads
no service module but the clients (and their packages) and no torch (pyproject.toml's import
contract says the same of the code; this says it of a real import)."""

import json
import subprocess
import sys

CLIENTS = [
    "env_svc.client",
    "sandbox_svc.client",
    "rollout_svc.client",
    "router_svc.client",
    "trainer_svc.client",
]
SERVICES = ("env_svc", "sandbox_svc", "rollout_svc", "router_svc", "trainer_svc")


def test_importing_the_clients_loads_no_service_internals_and_no_torch():
    code = (
        f"import json, sys\nfor m in {CLIENTS!r}: __import__(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        ).stdout
    )
    services = {m for m in loaded if m.split(".")[0] in SERVICES}
    assert services == set(CLIENTS) | set(SERVICES)
    assert "torch" not in loaded

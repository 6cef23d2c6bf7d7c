"""python -m sandbox_svc: serve the sandbox service until SIGTERM."""

from atgrpo.rpc.main import run_service
from sandbox_svc.server import bindings

if __name__ == "__main__":
    run_service("sandbox", bindings)

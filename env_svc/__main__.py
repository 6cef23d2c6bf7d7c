"""python -m env_svc: serve the env service until SIGTERM."""

from atgrpo.rpc.main import run_service
from env_svc.server import bindings

if __name__ == "__main__":
    run_service("env", bindings)

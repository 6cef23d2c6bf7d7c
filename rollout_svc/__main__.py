"""python -m rollout_svc: serve the rollout service until SIGTERM."""

from atgrpo.rpc.main import run_service
from rollout_svc.server import bindings

if __name__ == "__main__":
    run_service("rollout", bindings)

"""python -m router_svc: serve the router service until SIGTERM."""

from atgrpo.rpc.main import run_service
from router_svc.server import bindings

if __name__ == "__main__":
    run_service("router", bindings)

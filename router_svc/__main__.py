"""python -m router_svc: serve the router service until SIGTERM. The router has no settings of its
own: each run brings its config (StartRun)."""

from atgrpo.rpc.main import run_service
from router_svc.server import bindings

if __name__ == "__main__":
    run_service("router", lambda _: bindings())

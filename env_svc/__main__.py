"""python -m env_svc: serve the built-in and installed environments until SIGTERM."""

from atgrpo.rpc.main import run_service
from env_svc.server import bindings
from env_svc.settings import EnvSettings

if __name__ == "__main__":
    run_service("env", bindings, EnvSettings)

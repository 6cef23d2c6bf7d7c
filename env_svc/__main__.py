"""python -m env_svc: serve the built-in and installed environments until SIGTERM."""

from atgrpo.rpc.main import base_parser, run_service
from atgrpo.sdk.serve import add_host_flags
from env_svc.server import add_env_path_flag, bindings

if __name__ == "__main__":
    run_service("env", bindings, parser=add_env_path_flag(add_host_flags(base_parser("env"))))

"""The entry point every service's `python -m <svc>` shares.

Flags are deployment wiring only (where to listen, where to report the bound port); a service's
own settings come from its small config (later issues add them). `--port 0` binds a free port
and `--port-file` reports it, so a launcher never races another process for a port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import start_http_server

from atgrpo.rpc.security import TOKEN_ENV, TOKEN_FILE_ENV, ServerSecurity, token_from_env
from atgrpo.rpc.server import Binding, create_server, serve_until_signal

log = logging.getLogger(__name__)


def base_parser(service: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m {service}_svc", description=f"atgrpo {service} service")
    ap.add_argument("--host", default=os.environ.get("ATGRPO_HOST", "127.0.0.1"),
                    help="address to bind (0.0.0.0 or [::] inside a container)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("ATGRPO_PORT", "0")),
                    help="gRPC port; 0 picks a free one (see --port-file)")
    ap.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus /metrics on this port (0 = a free one); off when unset")
    ap.add_argument("--port-file", type=Path, default=None,
                    help="write {'port', 'metrics_port', 'pid'} as JSON here once serving")
    ap.add_argument("--grace-s", type=float, default=5.0, help="time calls in flight get on SIGTERM")
    ap.add_argument("--log-level", default=os.environ.get("ATGRPO_LOG_LEVEL", "INFO"))
    sec = ap.add_argument_group("security", "TLS, mutual TLS and the auth token (docs/deploy.md, Security)")
    sec.add_argument("--tls-cert", default=os.environ.get("ATGRPO_TLS_SERVER_CERT") or None, metavar="PEM",
                     help="serve TLS with this certificate (chain); needs --tls-key")
    sec.add_argument("--tls-key", default=os.environ.get("ATGRPO_TLS_SERVER_KEY") or None, metavar="PEM",
                     help="the private key of --tls-cert")
    sec.add_argument("--tls-client-ca", default=os.environ.get("ATGRPO_TLS_CLIENT_CA") or None, metavar="PEM",
                     help="mutual TLS: refuse clients without a certificate signed by this CA")
    sec.add_argument("--auth-token-file", default=os.environ.get(TOKEN_FILE_ENV) or None, metavar="FILE",
                     help=f"require the token in FILE on state-changing RPCs (LoadWeights, Setup, Train, "
                          f"SaveCheckpoint, StartRun, StopRun); default: ${TOKEN_ENV} when set")
    sec.add_argument("--health-port", type=int, default=None,
                     help="also serve the gRPC health check alone, in plaintext, on this port "
                          "(for probes that cannot speak TLS); off when unset")
    return ap


def server_security(args: argparse.Namespace) -> ServerSecurity:
    """The ServerSecurity of the flags (and their environment defaults)."""
    token = None if args.auth_token_file else token_from_env()
    return ServerSecurity.from_files(args.tls_cert, args.tls_key, args.tls_client_ca,
                                     token_file=args.auth_token_file, token=token)


def _write_port_file(path: Path, port: int, metrics_port: int | None) -> None:
    # Written to a temporary name and renamed, so a reader never sees half a file.
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"port": port, "metrics_port": metrics_port, "pid": os.getpid()}))
    tmp.replace(path)


async def _serve(args: argparse.Namespace, build: Callable[[argparse.Namespace], Sequence[Binding]],
                 service: str) -> None:
    security = server_security(args)   # before building: a bad setting fails fast, naming its flag
    # Built inside the event loop: servicers may create asyncio channels and background tasks.
    bindings = build(args)
    host = args.host.strip("[]")
    address = f"[{host}]:{args.port}" if ":" in host else f"{host}:{args.port}"
    health_address = None
    if args.health_port is not None:
        health_address = f"[{host}]:{args.health_port}" if ":" in host else f"{host}:{args.health_port}"
    running = await create_server(bindings, address, security=security, health_address=health_address)
    metrics_port = None
    if args.metrics_port is not None:
        httpd, _ = start_http_server(args.metrics_port, addr=host)
        metrics_port = httpd.server_port
    log.info("%s service listening on %s:%d (%s; metrics: %s)", service, host, running.port,
             security.describe(), metrics_port)
    if args.port_file:
        _write_port_file(args.port_file, running.port, metrics_port)
    await serve_until_signal(running, args.grace_s)
    log.info("%s service stopped", service)


def run_service(service: str, build: Callable[[argparse.Namespace], Sequence[Binding]],
                argv: Sequence[str] | None = None,
                parser: argparse.ArgumentParser | None = None) -> None:
    """Parse flags, build the servicers, serve until SIGTERM. `parser` may add service flags."""
    args = (parser or base_parser(service)).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(args, build, service))
    except OSError as err:
        raise SystemExit(f"{service}: {err}") from None

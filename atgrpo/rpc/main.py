"""The entry point every service's `python -m <svc>` shares.

Flags are read once, into two typed, validated objects: ServeSettings (deployment wiring: where
to listen, where to report the bound port, TLS and the token; the same for every service) and the
service's own settings (sandbox_svc.settings.SandboxSettings, ...). The rest of a service sees only
those objects. `--port 0` binds a free port and `--port-file` reports it, so a launcher never
races another process for a port.

A service serves from its first second: /metrics and the gRPC health check answer (NOT_SERVING)
while its servicers are built, which for a rollout replica means loading and warming up models
for minutes; other calls are refused as UNAVAILABLE until then. The port file is written only
once it serves, so a launcher that waits for the file waits for the load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from prometheus_client import Gauge, start_http_server

from atgrpo.rpc import tether
from atgrpo.rpc.security import TOKEN_ENV, TOKEN_FILE_ENV, ServerSecurity, token_from_env
from atgrpo.rpc.server import Binding, create_server, serve_until_signal

log = logging.getLogger(__name__)

LOG_LEVELS = tuple(logging.getLevelNamesMapping())  # what logging itself accepts (WARN too)
DRAIN_S = 300.0  # the default --parent-drain-s: a training step of a real model takes minutes

READY = Gauge(
    "atgrpo_service_ready",
    "1 once the service serves; 0 while it builds its servicers (loads its "
    "model), when health is NOT_SERVING and calls are refused as UNAVAILABLE.",
    ["service"],
)
BUILD_SECONDS = Gauge(
    "atgrpo_service_build_seconds",
    "How long the service took to build its servicers (load "
    "and warm up its models) before it served; 0 until then.",
    ["service"],
)

# A service's build: returns its bindings, or an awaitable of them. A build that blocks for long
# (loading a model) is async and runs that part in a thread, so health and /metrics answer
# meanwhile.
Build = Callable[[], Sequence[Binding] | Awaitable[Sequence[Binding]]]


class SettingsError(ValueError):
    """A flag's value no service can run with; the message names the flag and the fix."""


class ServiceSettings(Protocol):
    """A service's own settings: the flags that set them, and the validated object of those
    flags."""

    @staticmethod
    def add_flags(ap: argparse.ArgumentParser) -> None: ...

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Any: ...


S = TypeVar("S")


def base_parser(service: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=f"python -m {service}_svc", description=f"atgrpo {service} service"
    )
    ap.add_argument(
        "--host",
        default=os.environ.get("ATGRPO_HOST", "127.0.0.1"),
        help="address to bind (0.0.0.0 or [::] inside a container)",
    )
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("ATGRPO_PORT", "0")),
        help="gRPC port; 0 picks a free one (see --port-file)",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port (0 = a free one); off when unset",
    )
    ap.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write {'port', 'metrics_port', 'pid'} (and side ports: rollout's 'http_port') as "
        "JSON here once serving (its models loaded)",
    )
    ap.add_argument(
        "--grace-s", type=float, default=5.0, help="time calls in flight get on SIGTERM"
    )
    ap.add_argument("--log-level", default=os.environ.get("ATGRPO_LOG_LEVEL", "INFO"))
    ap.add_argument(
        "--parent-fd",
        type=int,
        default=None,
        metavar="FD",
        help="stop (as on SIGTERM) once this inherited file descriptor reaches end of file: the "
        "read end of a pipe whose write end the launcher holds, so the service ends with it",
    )
    ap.add_argument(
        "--parent-drain-s",
        type=float,
        default=DRAIN_S,
        help="once the launcher is gone, how long the work in flight may take before the stop",
    )
    sec = ap.add_argument_group(
        "security", "TLS, mutual TLS and the auth token (docs/deploy.md, Security)"
    )
    sec.add_argument(
        "--tls-cert",
        default=os.environ.get("ATGRPO_TLS_SERVER_CERT") or None,
        metavar="PEM",
        help="serve TLS with this certificate (chain); needs --tls-key",
    )
    sec.add_argument(
        "--tls-key",
        default=os.environ.get("ATGRPO_TLS_SERVER_KEY") or None,
        metavar="PEM",
        help="the private key of --tls-cert",
    )
    sec.add_argument(
        "--tls-client-ca",
        default=os.environ.get("ATGRPO_TLS_CLIENT_CA") or None,
        metavar="PEM",
        help="mutual TLS: refuse clients without a certificate signed by this CA",
    )
    sec.add_argument(
        "--auth-token-file",
        default=os.environ.get(TOKEN_FILE_ENV) or None,
        metavar="FILE",
        help=f"require the token in FILE on state-changing RPCs (LoadWeights, Setup, Train, "
        f"SaveCheckpoint, StartRun, StopRun); default: ${TOKEN_ENV} when set",
    )
    sec.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="also serve the gRPC health check alone, in plaintext, on this port "
        "(for probes that cannot speak TLS); off when unset",
    )
    return ap


def _open_fd(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.fstat(fd)
    except OSError:
        raise SettingsError(
            f"--parent-fd {fd}: not an open file descriptor of this process; it is for "
            "launchers, which pass the read end of a pipe (subprocess pass_fds)"
        ) from None


def _port(value: int | None, flag: str, *, optional: bool = False) -> None:
    if (value is not None or not optional) and not 0 <= value <= 65535:
        raise SettingsError(f"{flag} {value}: a port is between 1 and 65535 (0 = a free one)")


@dataclass(frozen=True)
class ServeSettings:
    """Where and how a service process serves; the same flags for every service."""

    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = None
    port_file: Path | None = None
    grace_s: float = 5.0
    log_level: str = "INFO"
    health_port: int | None = None
    parent_fd: int | None = None
    parent_drain_s: float = DRAIN_S
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    auth_token_file: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeSettings:
        _port(args.port, "--port")
        _port(args.metrics_port, "--metrics-port", optional=True)
        _port(args.health_port, "--health-port", optional=True)
        if not args.grace_s >= 0:
            raise SettingsError(
                f"--grace-s {args.grace_s}: give the seconds calls in flight get on SIGTERM (>= 0)"
            )
        if args.log_level.upper() not in LOG_LEVELS:
            raise SettingsError(
                f"--log-level {args.log_level!r}: use one of {', '.join(LOG_LEVELS)}"
            )
        _open_fd(args.parent_fd)
        if not args.parent_drain_s >= 0:
            raise SettingsError(
                f"--parent-drain-s {args.parent_drain_s}: give the seconds (>= 0) the work in "
                "flight gets once the launcher is gone"
            )
        return cls(
            args.host.strip("[]"),
            args.port,
            args.metrics_port,
            args.port_file,
            args.grace_s,
            args.log_level.upper(),
            args.health_port,
            args.parent_fd,
            args.parent_drain_s,
            args.tls_cert,
            args.tls_key,
            args.tls_client_ca,
            args.auth_token_file,
        )

    def security(self) -> ServerSecurity:
        """TLS and the token of these settings (the token from the environment unless a file is
        given)."""
        token = None if self.auth_token_file else token_from_env()
        return ServerSecurity.from_files(
            self.tls_cert,
            self.tls_key,
            self.tls_client_ca,
            token_file=self.auth_token_file,
            token=token,
        )

    def address(self, port: int) -> str:
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"


def parse(
    service: str,
    settings: type[ServiceSettings] | None = None,
    argv: Sequence[str] | None = None,
    prog: str | None = None,
) -> tuple[ServeSettings, Any]:
    """The flags as (ServeSettings, the service's settings); a bad value exits 2 naming the flag."""
    ap = base_parser(service)
    ap.prog = prog or ap.prog
    if settings is not None:
        settings.add_flags(ap)
    args = ap.parse_args(argv)
    try:
        return ServeSettings.from_args(args), settings.from_args(
            args
        ) if settings is not None else None
    except SettingsError as err:
        ap.error(str(err))


def _write_port_file(
    path: Path, port: int, metrics_port: int | None, side_ports: dict[str, int] | None = None
) -> None:
    # Written to a temporary name and renamed, so a reader never sees half a file.
    tmp = path.with_suffix(path.suffix + ".tmp")
    ports = {"port": port, "metrics_port": metrics_port, **(side_ports or {})}
    tmp.write_text(json.dumps({**ports, "pid": os.getpid()}))
    tmp.replace(path)


async def _serve(serve: ServeSettings, build: Build, service: str) -> None:
    security = serve.security()  # before building: a bad setting fails fast, naming its flag
    metrics_port = None
    READY.labels(service).set(0)
    BUILD_SECONDS.labels(service).set(0)
    if serve.metrics_port is not None:
        httpd, _ = start_http_server(serve.metrics_port, addr=serve.host)
        metrics_port = httpd.server_port
    health_address = serve.address(serve.health_port) if serve.health_port is not None else None
    running = await create_server(
        None, serve.address(serve.port), security=security, health_address=health_address
    )
    log.info(
        "%s service starting on %s:%d (%s; metrics: %s): health NOT_SERVING until its servicers "
        "are built",
        service,
        serve.host,
        running.port,
        security.describe(),
        metrics_port,
    )
    servicers: list = []
    if serve.parent_fd is not None:  # from now: a launcher gone during a long load stops it too
        _tie_to_launcher(serve, servicers)
    start = time.monotonic()
    try:
        bindings = await _built(build)
    except BaseException:
        await running.stop(0)
        raise
    servicers += [b.servicer for b in bindings]
    try:
        await running.open(bindings, serve.host)  # side ports (rollout's HTTP API) on our host
    except BaseException:
        await running.stop(0)
        raise
    BUILD_SECONDS.labels(service).set(time.monotonic() - start)
    READY.labels(service).set(1)
    log.info("%s service serving after %.1f s of building", service, time.monotonic() - start)
    if serve.port_file:
        _write_port_file(serve.port_file, running.port, metrics_port, running.side_ports)
    await serve_until_signal(running, serve.grace_s)
    log.info("%s service stopped", service)


async def _built(build: Build) -> Sequence[Binding]:
    # Called inside the event loop: servicers may create asyncio channels and background tasks.
    bindings = build()
    return await bindings if inspect.isawaitable(bindings) else bindings


def _tie_to_launcher(serve: ServeSettings, servicers: list) -> None:
    """Stop once the launcher's pipe closes (atgrpo.rpc.tether): its drain runs on this loop, after
    serve_until_signal has taken over SIGTERM."""
    loop = asyncio.get_running_loop()
    tether.watch(
        serve.parent_fd,
        lambda: asyncio.run_coroutine_threadsafe(
            tether.drain_then_stop(servicers, serve.parent_drain_s), loop
        ),
        hard_exit_after_s=serve.parent_drain_s + serve.grace_s + tether.HARD_EXIT_MARGIN_S,
    )


def serve_service(service: str, serve: ServeSettings, build: Build) -> None:
    """Serve at once (NOT_SERVING), build the servicers, serve them until SIGTERM. A process's
    main: it returns when the service has stopped, for the process to exit."""
    logging.basicConfig(
        level=serve.log_level, format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(_serve(serve, build, service))
    except OSError as err:
        raise SystemExit(f"{service}: {err}") from None
    finally:
        skip_exit_collection()


def skip_exit_collection() -> None:
    """Call last, in a process about to exit. The interpreter's final garbage collections walk
    every object it made: 0.8-1.0 s of exit for a process that loaded torch, transformers and the
    tiny model (measured here), so a local run's five services took over a second to stop after
    each had logged "stopped". Frozen, they are not walked (0.15 s). Nothing else changes:
    objects still die by their reference counts, atexit handlers and threads' joins still run."""
    gc.freeze()


def run_service(
    service: str,
    build: Callable[[S], Sequence[Binding] | Awaitable[Sequence[Binding]]],
    settings: type[ServiceSettings] | None = None,
    argv: Sequence[str] | None = None,
    prog: str | None = None,
) -> None:
    """`python -m <service>`: parse the flags, build the servicers from the service's settings,
    serve until SIGTERM."""
    serve, own = parse(service, settings, argv, prog)
    serve_service(service, serve, lambda: build(own))

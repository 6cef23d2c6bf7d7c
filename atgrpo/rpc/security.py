"""TLS, mutual TLS and a bearer token for every atgrpo channel, by configuration.

Servers (`python -m <svc>`, atgrpo.rpc.main): `--tls-cert` and `--tls-key` serve TLS,
`--tls-client-ca` also requires every client to present a certificate signed by that CA (mTLS),
and `--auth-token-file` (or the environment's ATGRPO_AUTH_TOKEN) requires the token on the RPCs
that change state (PROTECTED_METHODS): they are refused with UNAUTHENTICATED without it.

Clients (every ServiceClient, so every service-to-service call) read the environment:

    ATGRPO_TLS_CA           CA bundle (PEM) that signed the servers' certificates; turns TLS on
    ATGRPO_TLS_CERT/_KEY    this process's certificate and key, sent to servers that require mTLS
    ATGRPO_TLS_SERVER_NAME  the name to check servers' certificates against, when the addresses
                            are not in them (e.g. a pod IP)
    ATGRPO_AUTH_TOKEN       the token, sent as `authorization: Bearer <token>` on every call
    ATGRPO_AUTH_TOKEN_FILE  ... or a file holding it (a mounted Kubernetes Secret)

A service with ATGRPO_AUTH_TOKEN in its environment thus both requires the token and sends it.
Tokens are compared in constant time and never logged or echoed in a status message.
"""

from __future__ import annotations

import hmac
import logging
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

log = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
TOKEN_ENV = "ATGRPO_AUTH_TOKEN"
TOKEN_FILE_ENV = "ATGRPO_AUTH_TOKEN_FILE"

# The RPCs that change weights or runs. Everything else (health, reflection, GetInfo, the env's
# episodes, sandbox executions, Generate, Collect, WatchRun, GetRun) needs no token.
PROTECTED_METHODS = frozenset(
    {
        "/atgrpo.v1.RolloutService/LoadWeights",
        "/atgrpo.v1.TrainerService/Setup",
        "/atgrpo.v1.TrainerService/Train",
        "/atgrpo.v1.TrainerService/SaveCheckpoint",
        "/atgrpo.v1.TrainerService/DeleteCheckpoint",
        "/atgrpo.v1.RouterService/StartRun",
        "/atgrpo.v1.RouterService/StopRun",
    }
)


class SecurityConfigError(OSError):
    """A TLS or token setting that cannot be used; the message names the flag or variable."""


def _read(path: str | os.PathLike, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise SecurityConfigError(
            f"{what}={str(path)!r}: cannot read it ({err.strerror or err}); "
            "give the path of a readable PEM file"
        ) from None
    if not data.strip():
        raise SecurityConfigError(f"{what}={str(path)!r} is empty; give the path of a PEM file")
    return data


def read_token_file(path: str | os.PathLike, what: str) -> str:
    token = _read(path, what).decode("utf-8", errors="strict").strip()
    if any(c.isspace() for c in token) or not token.isprintable():
        raise SecurityConfigError(
            f"{what}={str(path)!r}: the token must be one line of printable "
            "characters without spaces"
        )
    return token


def _check_token(token: str, what: str) -> str:
    token = token.strip()
    if not token or any(c.isspace() for c in token) or not token.isprintable():
        raise SecurityConfigError(
            f"{what}: the token must be non-empty printable text without spaces"
        )
    return token


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """ATGRPO_AUTH_TOKEN, else the contents of ATGRPO_AUTH_TOKEN_FILE, else None."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV):
        return _check_token(env[TOKEN_ENV], TOKEN_ENV)
    if env.get(TOKEN_FILE_ENV):
        return read_token_file(env[TOKEN_FILE_ENV], TOKEN_FILE_ENV)
    return None


# ---- servers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSecurity:
    """How a server is reached: PEM bytes for TLS (and mTLS), and the token, if any."""

    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)
    client_ca: bytes | None = field(default=None, repr=False)  # set: clients must present a cert
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise SecurityConfigError(
                "TLS needs both a certificate and its key: give --tls-cert and --tls-key"
            )
        if self.client_ca and not self.cert:
            raise SecurityConfigError(
                "--tls-client-ca (mutual TLS) needs TLS itself: give --tls-cert and --tls-key too"
            )
        if self.token is not None:
            object.__setattr__(self, "token", _check_token(self.token, "the server's auth token"))

    @classmethod
    def from_files(
        cls,
        cert: str | None = None,
        key: str | None = None,
        client_ca: str | None = None,
        token_file: str | None = None,
        token: str | None = None,
    ) -> ServerSecurity:
        """From file paths (the flags); `token` is used when no `token_file` is given."""
        return cls(
            cert=_read(cert, "--tls-cert") if cert else None,
            key=_read(key, "--tls-key") if key else None,
            client_ca=_read(client_ca, "--tls-client-ca") if client_ca else None,
            token=read_token_file(token_file, "--auth-token-file") if token_file else token,
        )

    @property
    def tls(self) -> bool:
        return self.cert is not None

    @property
    def mutual_tls(self) -> bool:
        return self.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.mutual_tls,
        )

    def interceptors(self) -> list[aio.ServerInterceptor]:
        return [TokenAuthInterceptor(self.token)] if self.token else []

    def ssl_context(self) -> ssl.SSLContext | None:
        """The same TLS (and mutual TLS) for a service's HTTP port (rollout's OpenAI API) as for
        its gRPC port; None in plaintext. ssl loads a certificate chain from files only, so the PEM
        bytes pass through a private temporary directory, removed before this returns."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="atgrpo-tls-") as tmp:  # mode 0700
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(self.cert)
            key.write_bytes(self.key)
            ctx.load_cert_chain(cert, key)
        if self.mutual_tls:
            ctx.load_verify_locations(cadata=self.client_ca.decode())
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def describe(self) -> str:
        transport = "mutual TLS" if self.mutual_tls else "TLS" if self.tls else "plaintext"
        return f"{transport}, token {'required' if self.token else 'off'} for state-changing RPCs"


def bearer_ok(metadata: Sequence[tuple[str, Any]] | None, token: str) -> bool:
    """True when `metadata` carries `authorization: Bearer <token>` (constant-time compare)."""
    expected = token.encode()
    ok = False
    for key, value in metadata or ():
        if key != AUTH_METADATA_KEY:
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        scheme, _, presented = text.strip().partition(" ")
        if scheme.lower() == "bearer":
            # compare_digest on bytes of any length; `|=` keeps going so timing does not tell which.
            ok |= hmac.compare_digest(presented.strip().encode("utf-8", "replace"), expected)
    return ok


def _unauthenticated_message(method: str) -> str:
    return (
        f"{method} changes state and needs the cluster's auth token: pass it as "
        f"'{AUTH_METADATA_KEY}: Bearer <token>' metadata (atgrpo clients send it when "
        f"{TOKEN_ENV} or {TOKEN_FILE_ENV} is set in their environment)"
    )


def _refuse(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that reads nothing and aborts UNAUTHENTICATED."""
    message = _unauthenticated_message(method)

    async def abort(_request: Any, context: aio.ServicerContext) -> None:
        log.warning("refused %s from %s: no valid auth token", method, context.peer())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(_request: Any, context: aio.ServicerContext):
        await abort(_request, context)
        yield  # pragma: no cover - never reached, abort raises

    kw = dict(
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(abort, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kw)
    return grpc.stream_stream_rpc_method_handler(abort_stream, **kw)


class TokenAuthInterceptor(aio.ServerInterceptor):
    """Refuses PROTECTED_METHODS without the bearer token, before the servicer sees anything:
    a refused LoadWeights or Train reads none of its stream and changes nothing."""

    def __init__(self, token: str, protected: frozenset[str] = PROTECTED_METHODS):
        self._token = _check_token(token, "the server's auth token")
        self._protected = protected

    async def intercept_service(
        self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
    ):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method not in self._protected:
            return handler
        if bearer_ok(handler_call_details.invocation_metadata, self._token):
            return handler
        return _refuse(handler, method)


# ---- clients ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: the CA to trust, its own certificate (mTLS), and the token."""

    ca: bytes | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)
    server_name: str | None = None
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise SecurityConfigError(
                "a client certificate needs its key: set both ATGRPO_TLS_CERT and "
                "ATGRPO_TLS_KEY (or neither)"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientSecurity:
        env = os.environ if environ is None else environ
        return cls(
            ca=_read(env["ATGRPO_TLS_CA"], "ATGRPO_TLS_CA") if env.get("ATGRPO_TLS_CA") else None,
            cert=_read(env["ATGRPO_TLS_CERT"], "ATGRPO_TLS_CERT")
            if env.get("ATGRPO_TLS_CERT")
            else None,
            key=_read(env["ATGRPO_TLS_KEY"], "ATGRPO_TLS_KEY")
            if env.get("ATGRPO_TLS_KEY")
            else None,
            server_name=env.get("ATGRPO_TLS_SERVER_NAME") or None,
            token=token_from_env(env),
        )

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def options(self) -> list[tuple[str, object]]:
        return (
            [("grpc.ssl_target_name_override", self.server_name)]
            if self.tls and self.server_name
            else []
        )

    def interceptors(self) -> list[aio.ClientInterceptor]:
        if not self.token:
            return []
        header = (AUTH_METADATA_KEY, f"Bearer {self.token}")
        return [
            cls(header)
            for cls in (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)
        ]


def open_channel(
    address: str, options: Sequence[tuple[str, object]] = (), security: ClientSecurity | None = None
) -> aio.Channel:
    """An asyncio channel to `address`, secured as `security` says (default: the environment)."""
    sec = ClientSecurity.from_env() if security is None else security
    opts = [*options, *sec.options()]
    interceptors = sec.interceptors() or None
    creds = sec.credentials()
    if creds is None:
        return aio.insecure_channel(address, options=opts, interceptors=interceptors)
    return aio.secure_channel(address, creds, options=opts, interceptors=interceptors)


class _TokenClientInterceptor:
    def __init__(self, header: tuple[str, str]):
        self._header = header

    def _details(self, d: aio.ClientCallDetails) -> aio.ClientCallDetails:
        metadata = aio.Metadata(*(tuple(d.metadata) if d.metadata else ()))
        metadata.add(*self._header)
        return aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _UnaryUnaryToken(_TokenClientInterceptor, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _UnaryStreamToken(_TokenClientInterceptor, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _StreamUnaryToken(_TokenClientInterceptor, aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStreamToken(_TokenClientInterceptor, aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)

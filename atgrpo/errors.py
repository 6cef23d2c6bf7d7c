"""Domain errors that carry their gRPC status code and whether a caller should retry.

Logic modules raise these; the server interceptor turns them into statuses (DESIGN.md §4) and the
clients turn statuses back into them, so neither side handles grpc types outside the transport.
Every message says what was wrong and what to do instead.

grpc is imported only when a code is read: the trainer's maths raises these errors too, and it
runs where grpc is not installed (scripts/gpu_check.py's trainer part, on a bare GPU machine).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc


class _Code:
    """A class attribute that reads as grpc.StatusCode[name], importing grpc on first read."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner) -> grpc.StatusCode:
        import grpc

        return grpc.StatusCode[self.name]


class AtgrpoError(Exception):
    """Base class; `code` is the gRPC status the error travels as."""

    code = _Code("INTERNAL")
    retryable: bool = False

    def __init__(self, message: str, *, retry_after_ms: int | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after_ms = retry_after_ms


class InvalidArgument(AtgrpoError):
    """The request is wrong; sending it again will fail the same way."""

    code = _Code("INVALID_ARGUMENT")


class NotFound(AtgrpoError):
    """A named thing (episode, pool, env, run) does not exist; do not retry."""

    code = _Code("NOT_FOUND")


class FailedPrecondition(AtgrpoError):
    """A version or state mismatch: refresh what you know (e.g. the policy version) first."""

    code = _Code("FAILED_PRECONDITION")


class ResourceExhausted(AtgrpoError):
    """A queue or cap is full; retry with backoff (after `retry_after_ms` when given)."""

    code = _Code("RESOURCE_EXHAUSTED")
    retryable = True


class MessageTooLarge(ResourceExhausted):
    """gRPC refused a message over the size cap (64 MiB by default). The same message is refused
    every time, so this one is not retried: send less per call (fewer samples, shorter texts)."""

    retryable = False


class Unavailable(AtgrpoError):
    """The service is down, starting or shutting down; retry with backoff."""

    code = _Code("UNAVAILABLE")
    retryable = True


class DeadlineExceeded(AtgrpoError):
    """The call ran past its deadline; retrying is safe only for idempotent calls."""

    code = _Code("DEADLINE_EXCEEDED")
    retryable = True


class Unimplemented(AtgrpoError):
    """The RPC exists in the contract but this build does not serve it yet."""

    code = _Code("UNIMPLEMENTED")


class Unauthenticated(AtgrpoError):
    """A state-changing RPC without the cluster's auth token (atgrpo.rpc.security); set
    ATGRPO_AUTH_TOKEN (or ATGRPO_AUTH_TOKEN_FILE) for the client, then retry."""

    code = _Code("UNAUTHENTICATED")


class Internal(AtgrpoError):
    """A bug on the server side; the message says where."""

    code = _Code("INTERNAL")


class EnvCodeError(AtgrpoError):
    """An environment's own code raised, or returned something the SDK cannot take (a NaN reward,
    no StepResult): a bug in the environment, not in atgrpo. The same task fails the same way
    again, so it is not retried; the env service's log has the traceback. Travels as UNKNOWN."""

    code = _Code("UNKNOWN")


@functools.cache
def _by_code() -> dict[grpc.StatusCode, type[AtgrpoError]]:
    return {
        cls.code: cls
        for cls in (
            InvalidArgument,
            NotFound,
            FailedPrecondition,
            ResourceExhausted,
            Unavailable,
            DeadlineExceeded,
            Unimplemented,
            Unauthenticated,
            Internal,
            EnvCodeError,
        )
    }


# Trailing metadata key carrying a retry hint with RESOURCE_EXHAUSTED.
RETRY_AFTER_KEY = "atgrpo-retry-after-ms"


# How gRPC words a size refusal, on either side ("Sent/Received message larger than max (N vs. M)").
_SIZE_REFUSAL = "message larger than max"


def error_for_status(
    code: grpc.StatusCode, message: str, retry_after_ms: int | None = None
) -> AtgrpoError:
    """The domain error for a gRPC status (unknown codes become Internal, keeping the code name)."""
    import grpc

    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _SIZE_REFUSAL in message.lower():
        return MessageTooLarge(
            f"{message}: the message is over the gRPC size cap; send less per call"
        )
    cls = _by_code().get(code)
    if cls is None:
        return Internal(f"{code.name}: {message}", retry_after_ms=retry_after_ms)
    return cls(message, retry_after_ms=retry_after_ms)

"""The backend interface: run one resolved ExecRequest in slot `slot`, blocking, and say how it
went.

The executor calls `run` from a worker thread, at most one execution per slot at a time, so a
backend may give each slot its own resources (a uid, a warm container).
"""

from __future__ import annotations

import threading
from typing import Protocol

from atgrpo.contract.sandbox import ExecRequest, ExecResult


class BackendUnavailable(RuntimeError):
    """The backend cannot run here; the message names the fix. The server refuses to start."""


class Backend(Protocol):
    name: str
    isolated: bool

    def check(self) -> None:
        """Raise BackendUnavailable (naming the fix) unless this backend can run here."""

    def run(self, req: ExecRequest, slot: int, cancel: threading.Event | None = None) -> ExecResult:
        """Run the program; never raises for anything the program does (that is a verdict)."""

    def close(self) -> None:
        """Release what the backend holds (containers, ...)."""

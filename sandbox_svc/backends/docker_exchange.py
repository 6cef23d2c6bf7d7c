"""One execution's exchange with the docker backend's launcher (docker_programs.py), over the
`docker exec` stream: the payload the launcher reads (a length-prefixed JSON header with the
program's argv, environment, rlimits and syscall filter, then the files and stdin), the frames it
answers with inside docker's multiplexed stream (output, stderr, the report), and the pump that
tells it to kill the program on the wall deadline, a cancel or an output over its limit.

Kept apart from docker.py, which keeps the warm containers and decides from an exchange whether a
container may be reused (see its docstring for the whole protocol).
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time

from atgrpo.contract.sandbox import ExecRequest, Limits
from sandbox_svc.backends.process import Output, cpu_limit_s
from sandbox_svc.languages import Language
from sandbox_svc.syscalls import launcher_seccomp

_PATH = "/usr/bin:/bin"
_KILL_GRACE_S = 3.0  # how long a killed execution may take to report before its container goes
_READ_CHUNK = 1 << 16


def _rlimits(limits: Limits) -> list[tuple[str, int]]:
    cpu = cpu_limit_s(limits)
    return [
        # Soft = hard, as for prlimit in process.py: SIGKILL at the CPU limit.
        ("RLIMIT_CPU", cpu),
        ("RLIMIT_AS", limits.memory_bytes),
        ("RLIMIT_FSIZE", limits.max_file_bytes),
        ("RLIMIT_NOFILE", limits.max_open_files),
        # The launcher runs as the same uid and counts against RLIMIT_NPROC.
        ("RLIMIT_NPROC", limits.max_processes + 1),
        ("RLIMIT_CORE", 0),
    ]


class _Frames:
    """Parses docker's multiplexed exec stream, then the launcher's frames inside its stdout."""

    def __init__(self) -> None:
        self.raw = bytearray()  # docker frames: 8-byte header (stream, 0, 0, 0, size) + data
        self.ours = bytearray()  # launcher frames from the exec's stdout
        self.diag = bytearray()  # the launcher's own stderr (only its crashes)

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.raw += data
        while len(self.raw) >= 8:
            stream, size = self.raw[0], struct.unpack(">I", self.raw[4:8])[0]
            if len(self.raw) < 8 + size:
                break
            payload = bytes(self.raw[8 : 8 + size])
            del self.raw[: 8 + size]
            if stream == 1:
                self.ours += payload
            elif len(self.diag) < 65536:
                self.diag += payload
        frames = []
        while len(self.ours) >= 5:
            kind, size = bytes(self.ours[:1]), struct.unpack(">I", self.ours[1:5])[0]
            if len(self.ours) < 5 + size:
                break
            frames.append((kind, bytes(self.ours[5 : 5 + size])))
            del self.ours[: 5 + size]
        return frames


def _payload(req: ExecRequest, language: Language, workdir: str) -> list[bytes]:
    """What the launcher reads from the exec's stdin: a length-prefixed JSON header (where to write
    the files, the program's argv, its environment, rlimits and syscall filter), then the files'
    bytes and the program's stdin."""
    files = [(language.filename, req.code.encode()), *req.files]
    header = json.dumps(
        {
            "dir": workdir,
            "files": [[path, len(content)] for path, content in files],
            "stdin": len(req.stdin),
            "argv": list(language.argv),
            "env": {"PATH": _PATH, "HOME": workdir},
            "rlimits": _rlimits(req.limits),
            "seccomp": launcher_seccomp(),
        }
    ).encode()
    return [struct.pack(">I", len(header)), header, *(c for _, c in files), req.stdin]


class _Exchange:
    """One execution's stream: the program's output, the launcher's report, and whether (and why)
    the launcher was told to kill the program."""

    def __init__(self, max_output_bytes: int) -> None:
        self.out, self.err = Output(max_output_bytes), Output(max_output_bytes)
        self.frames = _Frames()
        self.report: dict | None = None
        self.killed_for: str | None = None  # wall | cancel | output
        self.kill_sent_at: float | None = None
        self.broken = False  # the container is not to be reused

    def pump(self, raw, payload: list[bytes], deadline: float, cancel) -> None:
        """Send the payload, then read until the launcher ends the stream; on the deadline, a
        cancel or a truncated output, tell it to kill the program, and give up on it (broken)
        when it does not answer within _KILL_GRACE_S."""
        raw.settimeout(max(deadline - time.monotonic(), 0.1) + 5)
        for part in payload:
            raw.sendall(part)
        raw.setblocking(False)
        while True:
            now = time.monotonic()
            if self.killed_for is None:
                self.killed_for = self._kill_reason(now, deadline, cancel)
            if self.killed_for is not None and self.kill_sent_at is None:
                self.kill_sent_at = now
                _send_kill(raw)
            if self.kill_sent_at is not None and now - self.kill_sent_at > _KILL_GRACE_S:
                self.broken = True  # the launcher does not answer: the container goes
                return
            wait = 0.05 if self.killed_for is not None else min(0.05, max(deadline - now, 0))
            data = _receive(raw, wait)
            if data is None:
                continue
            if not data:
                return
            self._take(data)

    def _kill_reason(self, now: float, deadline: float, cancel) -> str | None:
        if now >= deadline:
            return "wall"
        if cancel is not None and cancel.is_set():
            return "cancel"
        if self.out.truncated or self.err.truncated:
            return "output"
        return None

    def _take(self, data: bytes) -> None:
        for kind, chunk in self.frames.feed(data):
            if kind == b"o":
                self.out.add(chunk)
            elif kind == b"e":
                self.err.add(chunk)
            elif kind == b"r":
                self.report = json.loads(chunk)


def _send_kill(raw) -> None:
    try:
        raw.setblocking(True)
        raw.settimeout(1)
        raw.sendall(b"K")
    except OSError:
        pass
    finally:
        raw.setblocking(False)


def _receive(raw, wait: float) -> bytes | None:
    """The stream's next bytes, b"" at its end, or None when none came within `wait` seconds."""
    if not _pending(raw) and not select.select([raw], [], [], wait)[0]:
        return None
    try:
        return raw.recv(_READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return None


def _pending(raw) -> bool:
    pending = getattr(raw, "pending", None)  # TLS sockets may hold decrypted bytes already read
    return bool(pending and pending())


def _close_socket(sock) -> None:
    raw = getattr(sock, "_sock", sock)
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    for s in (raw, sock):
        try:
            s.close()
        except OSError:
            pass

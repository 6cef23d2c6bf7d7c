"""A warm sandbox: one long-lived bwrap namespace per worker slot, serving programs by fork.

Creating namespaces and starting an interpreter cost more than a short program itself; here
both are paid once per slot, and each program is a fork of a small pid-1 interpreter inside the
sandbox (zygote.py). What one program could leave for the next is removed after it (processes,
files) or, when it cannot be (SysV IPC, message queues), the sandbox is discarded and a fresh one
started: reuse only where it is safe.
"""

from __future__ import annotations

import array
import base64
import json
import logging
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from atgrpo.contract.sandbox import ExecRequest, ExecResult, Verdict
from sandbox_svc.backends.process import Output, await_end, memfd_with, pump, verdict
from sandbox_svc.languages import LANGUAGES
from sandbox_svc.syscalls import launcher_seccomp

log = logging.getLogger(__name__)

# The zygote, after the lock-down it applies to every program (both standard library only).
ZYGOTE_SOURCE = "\n".join(
    Path(__file__).with_name(name).read_text() for name in ("lockdown.py", "zygote.py")
)
_REPLY_TIMEOUT_S = 5.0
# How long the zygote may take to wipe /tmp and /dev/shm after a program (a program can leave
# millions of files there) before the sandbox is discarded instead; a fresh one starts in ~0.1 s.
_WIPE_TIMEOUT_S = 2.0
# Processes of the slot's uid besides the program's own: bwrap and the zygote.
_SANDBOX_PROCESSES = 2


class SandboxBroken(RuntimeError):
    """The sandbox stopped answering; it is discarded. `delivered`: whether the program had been
    handed to it (and so may have run, in part): only an undelivered one is retried."""

    def __init__(self, message: str, delivered: bool = False):
        super().__init__(message)
        self.delivered = delivered


class WarmSandbox:
    def __init__(self, argv_prefix: list[str], uid: int | None, sweep: Callable[[], None] | None):
        """`argv_prefix`: the uid switch plus bwrap with its namespace options, before the
        command."""
        self.argv_prefix, self.uid, self.sweep = argv_prefix, uid, sweep
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.served = 0

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [
            *self.argv_prefix,
            "python3",
            "-I",
            "-B",
            "-c",
            ZYGOTE_SOURCE,
            str(theirs.fileno()),
            json.dumps(launcher_seccomp()),
        ]
        try:
            self.proc = subprocess.Popen(
                argv,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={},
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.ctl = ours
        try:
            self._reply()  # {"ready": true}
        except SandboxBroken:
            err = (
                self.proc.stderr.read().decode(errors="replace")
                if self.proc.poll() is not None
                else ""
            )
            self.stop()
            raise SandboxBroken(
                f"the sandbox did not start: {err.strip() or 'no answer'}"
            ) from None

    def _reply(self, timeout_s: float = _REPLY_TIMEOUT_S) -> dict:
        self.ctl.settimeout(timeout_s)
        try:
            data = self.ctl.recv(4096)
        except OSError as err:
            raise SandboxBroken(f"no reply from the sandbox: {err}") from None
        if not data:
            raise SandboxBroken("the sandbox closed its control socket")
        return json.loads(data)

    def _delivered_reply(self) -> dict:
        try:
            return self._reply()
        except SandboxBroken as err:
            raise SandboxBroken(str(err), delivered=True) from None

    def own_pids(self) -> set[int]:
        """bwrap and the zygote: the processes that stay between programs."""
        if self.proc is None:
            return set()
        try:
            return {self.proc.pid, *(c.pid for c in psutil.Process(self.proc.pid).children())}
        except psutil.NoSuchProcess:
            return set()

    def stop(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.proc is not None:
            # The zygote is in a session of its own: kill it by pid, not only bwrap's group, then
            # wait for it (it is re-parented to this process, a subreaper, and must be reaped).
            inner = []
            for pid in self.own_pids() - {self.proc.pid}:
                try:
                    inner.append(psutil.Process(pid))
                except psutil.NoSuchProcess:
                    pass  # ended between the listing and now (seen in CI as an INTERNAL Execute)
            for target in (self.proc.pid, *(p.pid for p in inner)):
                try:
                    os.kill(target, 9)
                except ProcessLookupError:
                    pass
            self.proc.wait()
            self.proc.stderr.close()
            self.proc = None
            psutil.wait_procs(inner, timeout=2.0)
        if self.sweep is not None:
            self.sweep()

    def run(self, req: ExecRequest, cancel: threading.Event | None) -> ExecResult:
        if self.proc is not None and self.proc.poll() is not None:
            self.stop()  # died while idle: a fresh one, before the program is handed over
        if self.proc is None:
            self.start()
        language = LANGUAGES[req.language]
        limits = req.limits
        payload = json.dumps(
            {
                "code": req.code,
                "filename": language.filename,
                "files": {p: base64.b64encode(c).decode() for p, c in req.files},
                "argv": None if language.name == "python" else list(language.argv),
                "limits": {
                    **limits.__dict__,
                    "max_processes": limits.max_processes + _SANDBOX_PROCESSES,
                },
            }
        ).encode()
        out, err = Output(limits.max_output_bytes), Output(limits.max_output_bytes)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sent = [memfd_with("payload", payload), memfd_with("stdin", req.stdin), out_w, err_w]
        start = time.monotonic()
        try:
            self.ctl.sendmsg(
                [b"run"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", sent))]
            )
        except OSError as e:
            raise SandboxBroken(f"could not reach the sandbox: {e}") from None
        finally:
            for fd in sent:
                os.close(fd)
        try:
            self._delivered_reply()  # {"started": pid}
            deadline = start + limits.wall_timeout_ms / 1000
            killed_for = pump([(out_r, out), (err_r, err)], deadline, cancel)
            if killed_for is None:  # its pipes are closed; the program may still be running
                killed_for = await_end(
                    lambda t: bool(select.select([self.ctl], [], [], t)[0]), deadline, cancel
                )
            if killed_for is not None:
                self.ctl.send(b"kill")
            reply = self._delivered_reply()  # {"status", "cpu_ms"}: the program is over
        finally:
            os.close(out_r)
            os.close(err_r)
        self.served += 1
        self._after_wipe()
        status = reply["status"]
        code, sig = (
            (os.WEXITSTATUS(status), 0) if os.WIFEXITED(status) else (0, os.WTERMSIG(status))
        )
        stderr = bytes(err.data)
        return ExecResult(
            verdict=verdict(killed_for, code, sig, reply["cpu_ms"], stderr, limits, language),
            exit_code=code,
            signal=sig,
            stdout=bytes(out.data),
            stderr=stderr,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            wall_ms=int((time.monotonic() - start) * 1000),
            cpu_ms=reply["cpu_ms"],
        )

    def _after_wipe(self) -> None:
        """Keep the sandbox only if the zygote wiped it in time. The program has run and its result
        is in hand whatever happens here: a slow or failed wipe discards the sandbox, and the
        program is never run again (run_warm retries only a sandbox that broke before that)."""
        try:
            clean = self._reply(_WIPE_TIMEOUT_S)["clean"]
        except SandboxBroken as err:
            clean = False
            log.info(
                "discarding a sandbox: wiping it after its last program took too long (%s)", err
            )
        if not clean:
            log.info("discarding a sandbox: its last program left state that cannot be wiped")
            self.stop()


def run_warm(sandbox: WarmSandbox, req: ExecRequest, cancel: threading.Event | None) -> ExecResult:
    """Run in `sandbox`. A sandbox that broke before the program reached it is replaced and the
    program run there, once; one that broke after is not: a program is never run twice (it may
    have written, printed or spent its time), and the answer says why it stopped."""
    for attempt in (0, 1):
        try:
            return sandbox.run(req, cancel)
        except SandboxBroken as err:
            sandbox.stop()
            if err.delivered or attempt:
                ran = (
                    "while the program ran; it was not run again"
                    if err.delivered
                    else "twice before the program ran"
                )
                log.warning("sandbox broken %s (%s)", ran, err)
                return ExecResult(
                    verdict=Verdict.KILLED, stderr=f"sandbox failure {ran}: {err}".encode()
                )
            log.warning(
                "sandbox broken before the program reached it (%s); starting a fresh one", err
            )
    raise AssertionError("unreachable")

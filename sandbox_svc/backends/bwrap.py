"""The default backend: bubblewrap namespaces plus rlimits (DESIGN.md §5).

Each worker slot has one sandbox: new user, pid, network, ipc, uts and cgroup namespaces (no
network at all: not even the host's loopback is reachable), a read-only /usr and nothing else of
the host (no /etc, no /home, no server files), a private size-capped /tmp as the working
directory, an unprivileged uid, and an empty environment. The root is remounted read-only, so a
program can write only to /tmp and /dev/shm, both capped and wiped after every program. Programs
run as forks of a warm interpreter inside it (warm.py), under the request's rlimits.

When the server runs as root, each worker slot runs its programs under its own host uid
(`uid_base + slot`): RLIMIT_NPROC then bounds a fork bomb per slot, no sandboxed program can
signal the server or another slot's program, and after a kill every process of that uid is swept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import psutil

from atgrpo.contract.sandbox import ExecRequest, ExecResult
from sandbox_svc.backends.base import BackendUnavailable
from sandbox_svc.backends.process import as_uid, become_subreaper, reap_orphans
from sandbox_svc.backends.warm import WarmSandbox, run_warm
from sandbox_svc.policy import Policy

SANDBOX_UID = 65534  # "nobody" inside the namespace


def sweep_uid(uid: int, timeout_s: float = 2.0) -> None:
    """Kill every process running as `uid` (kill(-1) signals all a uid may signal but itself),
    then reap those that were re-parented to us. A program whose sandbox init was killed dies (and
    is re-parented to us) a moment later, so this reaps until none of `uid` is left, or
    timeout_s."""
    subprocess.run(
        [*as_uid(uid), "/usr/bin/kill", "-9", "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={},
        check=False,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        reap_orphans(uid)
        left = [
            p
            for p in psutil.process_iter(["uids"])
            if p.info["uids"] and p.info["uids"].real == uid
        ]
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.01)


class BwrapBackend:
    name = "bwrap"
    isolated = True

    def __init__(
        self, policy: Policy | None = None, uid_base: int = 60000, bwrap: str | None = None
    ):
        self.policy = policy or Policy()
        self.bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self.uid_base = uid_base if os.geteuid() == 0 else None
        self._sandboxes: dict[int, WarmSandbox] = {}
        self._lock = threading.Lock()
        become_subreaper()

    def uid_for(self, slot: int) -> int | None:
        return None if self.uid_base is None else self.uid_base + slot

    def check(self) -> None:
        fix = (
            "install bubblewrap (apt-get install bubblewrap), or start the server with "
            "--backend docker, or --backend subprocess --unsafe-no-isolation for local development "
            "only"
        )
        if not os.path.exists(self.bwrap):
            raise BackendUnavailable(
                f"the bwrap backend needs bubblewrap, which is not installed: {fix}"
            )
        if not os.path.exists("/usr/bin/python3"):
            raise BackendUnavailable(
                "the bwrap backend runs /usr/bin/python3, which is missing: "
                "apt-get install python3-minimal"
            )
        probe = subprocess.run(
            [*as_uid(self.uid_for(0)), self.bwrap, *self._namespace_args(1 << 20), "true"],
            capture_output=True,
            env={},
        )
        if probe.returncode != 0:
            raise BackendUnavailable(
                f"bubblewrap cannot create namespaces here "
                f"({probe.stderr.decode(errors='replace').strip()}); "
                "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1), "
                f"or use another backend: {fix}"
            )

    def _namespace_args(self, tmp_bytes: int) -> list[str]:
        return [
            "--unshare-all",
            "--unshare-user",
            "--die-with-parent",
            "--new-session",
            "--disable-userns",
            # The program is pid 1: its exit tears the namespace down (no process outlives it),
            # and bwrap reaps it, so its CPU time reaches our wait4 (bwrap's own init would not).
            "--as-pid-1",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--symlink",
            "usr/bin",
            "/bin",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(tmp_bytes),
            "--tmpfs",
            "/tmp",
            "--size",
            str(tmp_bytes),
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/",
            "--chdir",
            "/tmp",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin",
            "--setenv",
            "HOME",
            "/tmp",
        ]

    def _sandbox(self, slot: int) -> WarmSandbox:
        with self._lock:
            if slot not in self._sandboxes:
                uid = self.uid_for(slot)
                prefix = [
                    *as_uid(uid),
                    self.bwrap,
                    *self._namespace_args(self.policy.tmp_bytes),
                    "--mqueue",
                    "/dev/mqueue",
                ]
                self._sandboxes[slot] = WarmSandbox(
                    prefix, uid, (lambda: sweep_uid(uid)) if uid is not None else None
                )
            return self._sandboxes[slot]

    def sandbox_pids(self, slot: int) -> set[int]:
        """The processes of slot's warm sandbox itself (not of any program)."""
        sandbox = self._sandboxes.get(slot)
        return sandbox.own_pids() if sandbox else set()

    def run(self, req: ExecRequest, slot: int, cancel: threading.Event | None = None) -> ExecResult:
        return run_warm(self._sandbox(slot), req, cancel)

    def close(self) -> None:
        with self._lock:
            for sandbox in self._sandboxes.values():
                sandbox.stop()
            self._sandboxes.clear()

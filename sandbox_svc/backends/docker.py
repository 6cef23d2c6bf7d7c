"""The docker backend: each worker slot keeps a warm, locked-down container and runs programs in it.

Every container has no network (`network_mode=none`), a read-only root, no capabilities, no new
privileges, the engine's default seccomp profile (and, per program, the sandbox's own: syscalls.py),
memory and pids limits, a size-capped private /tmp and /dev/shm, and SysV message queues and
semaphores switched off (shared memory segments die with their last user). Its pid 1 is a tiny idle
process running as `nobody` that reaps orphans and exits when the server's attach connection to its
stdin closes, so a server that dies leaves no container behind (they are `auto_remove`d).

An execution is one `docker exec`, as the slot's own uid (SANDBOX_UID_BASE + slot, never the uid of
pid 1 nor of another slot), of a small launcher (`python3 -c LAUNCHER`). The launcher:

- reads the program, its files and its stdin from the exec's stdin (length-prefixed), writes them
  in a fresh /tmp/run-<n>, and makes itself non-dumpable, so that nothing the program starts can
  ptrace it, open its fds or read its memory;
- forks the program with rlimits (CPU, address space, file size, open files, processes, no core)
  and the syscall filter (lockdown.py),
  its stdin from an in-memory file, its stdout/stderr on pipes of its own, an empty environment
  but PATH and HOME, and relays the output to the server in frames the program cannot forge (it
  never holds the exec's own stdout);
- when the program exits, or when the server sends b"K" (wall timeout, output limit, cancel) or
  goes away: kills every process of the slot's uid (kill(-1), which no fork can outrun), waits
  until they are gone, wipes /tmp, /dev/shm and /dev/mqueue, checks that no SysV IPC object is
  left, and sends a report: exit status, CPU time from wait4, and whether the container is clean.

The server reuses a container only after a clean report; otherwise (no report, a problem listed,
the launcher killed or stuck) it removes the container at once and the slot gets a fresh one on
its next execution. So no process outlives its request, and nothing one execution leaves in the
container reaches the next. The exchange with the launcher over one exec's stream (the payload,
the frames, the kill) is docker_exchange.py.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from atgrpo.contract.sandbox import ExecRequest, ExecResult, Verdict
from sandbox_svc.backends.base import BackendUnavailable
from sandbox_svc.backends.docker_exchange import _close_socket, _Exchange, _payload
from sandbox_svc.backends.docker_image import IDLE_UID, SANDBOX_UID_BASE
from sandbox_svc.backends.docker_programs import IDLE, LAUNCHER
from sandbox_svc.backends.process import verdict
from sandbox_svc.languages import LANGUAGES
from sandbox_svc.policy import Policy

log = logging.getLogger("sandbox_svc.docker")

_FIX_SDK = "install the Docker SDK: pip install 'atgrpo[docker]'"
_FIX_ENGINE = (
    "start the Docker engine (systemctl start docker, or dockerd), or point DOCKER_HOST at "
    "a running one; or use --backend bwrap"
)
_LABEL = "org.atgrpo.sandbox"


@dataclass
class _Warm:
    id: str
    attach: object  # the hijacked socket on pid 1's stdin; closing it stops the container


class DockerBackend:
    name = "docker"
    isolated = True

    def __init__(
        self,
        policy: Policy | None = None,
        image: str | None = None,
        client=None,
        *,
        uid_base: int = SANDBOX_UID_BASE,
        mem_limit: int | None = None,
        pids_limit: int | None = None,
    ):
        self.policy = policy or Policy()
        self.image = image
        self._client = client
        self.uid_base = uid_base
        ceilings = self.policy.ceilings
        # Backstops for the whole container; each execution is bounded by its own rlimits first.
        self.mem_limit = mem_limit or ceilings.memory_bytes + 2 * self.policy.tmp_bytes + 64 * 2**20
        self.pids_limit = pids_limit or ceilings.max_processes + 16
        self._warm: dict[int, _Warm] = {}
        self._lock = threading.Lock()
        self._runs = itertools.count(1)

    # -- engine and image ----------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            try:
                import docker
            except ImportError as err:
                raise BackendUnavailable(
                    f"the docker backend needs the Docker SDK ({err}): {_FIX_SDK}"
                ) from err
            self._client = docker.from_env()
        return self._client

    def _where(self) -> str:
        if self._client is not None:
            return str(self._client.api.base_url)
        return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")

    def check(self) -> None:
        try:
            import docker  # noqa: F401
        except ImportError as err:
            raise BackendUnavailable(
                f"the docker backend needs the Docker SDK ({err}): {_FIX_SDK}"
            ) from err
        try:
            self.client.ping()
        except BackendUnavailable:
            raise
        except Exception as err:
            raise BackendUnavailable(
                f"the Docker engine at {self._where()} does not answer ({err}): {_FIX_ENGINE}"
            ) from err
        if self.image is None:
            from sandbox_svc.backends.docker_image import ensure_image

            try:
                self.image = ensure_image(self.client)
            except Exception as err:
                raise BackendUnavailable(
                    f"cannot build the docker backend's image from this host's python3 ({err}); "
                    "install python3.11 (apt-get install python3.11), or pass --docker-image with "
                    "an image that has /usr/bin/python3"
                ) from err
        else:
            try:
                self.client.api.inspect_image(self.image)
            except Exception as err:
                raise BackendUnavailable(
                    f"the docker image {self.image!r} is not in the engine ({err}): "
                    "load it (docker load / docker import) or leave --docker-image "
                    "unset to build one from this host's python3"
                ) from err
        try:
            probe = self.run(ExecRequest("python", "print(6 * 7)"), 0)
        except Exception as err:
            raise BackendUnavailable(
                f"the docker backend cannot start a sandbox container from {self.image} ({err}); "
                "check the engine's log, or use --backend bwrap"
            ) from err
        if probe.verdict is not Verdict.OK or probe.stdout != b"42\n":
            raise BackendUnavailable(
                f"the docker backend cannot run a program in {self.image} ({probe.verdict.value}: "
                f"{probe.stderr[-500:].decode(errors='replace')}); check the engine's log, or use "
                "--backend bwrap"
            )

    # -- warm containers -------------------------------------------------------------------------

    def _container(self, slot: int) -> _Warm:
        warm = self._warm.get(slot)
        if warm is None:
            warm = self._warm[slot] = self._create(slot)
        return warm

    def _create(self, slot: int) -> _Warm:
        if self.image is None:
            from sandbox_svc.backends.docker_image import ensure_image

            self.image = ensure_image(self.client)
        api = self.client.api
        tmp = self.policy.tmp_bytes
        host_config = api.create_host_config(
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=self.mem_limit,
            memswap_limit=self.mem_limit,  # no swap on top
            pids_limit=self.pids_limit,
            tmpfs={"/tmp": f"size={tmp},mode=1777"},
            shm_size=tmp,
            sysctls={
                "kernel.msgmni": "0",  # no SysV message queues,
                "kernel.sem": "250 32000 32 0",  # no SysV semaphore sets,
                "kernel.shm_rmid_forced": "1",  # shm segments die with their users
            },
            auto_remove=True,
        )
        created = api.create_container(
            self.image,
            ["python3", "-I", "-S", "-c", IDLE],
            user=f"{IDLE_UID}:{IDLE_UID}",
            stdin_open=True,
            environment={},
            working_dir="/tmp",
            host_config=host_config,
            labels={
                _LABEL: "1",
                f"{_LABEL}.slot": str(slot),
                f"{_LABEL}.server-pid": str(os.getpid()),
            },
            name=f"atgrpo-sandbox-{os.getpid()}-{slot}-{os.urandom(3).hex()}",
        )
        cid = created["Id"]
        try:
            attach = api.attach_socket(cid, params={"stdin": 1, "stream": 1})
            api.start(cid)
        except Exception:
            self._remove(cid)
            raise
        return _Warm(cid, attach)

    def _remove(self, cid: str) -> None:
        try:
            self.client.api.remove_container(cid, force=True)
        except Exception as err:  # noqa: BLE001 - already gone (auto_remove) or the engine is down
            if "No such container" not in str(err) and "is already in progress" not in str(err):
                log.warning("could not remove sandbox container %s: %s", cid[:12], err)

    def _discard(self, slot: int) -> None:
        warm = self._warm.pop(slot, None)
        if warm is None:
            return
        self._remove(warm.id)
        _close_socket(warm.attach)

    def uid_for(self, slot: int) -> int:
        return self.uid_base + slot

    def container_id(self, slot: int) -> str | None:
        """The id of slot `slot`'s warm container, or None while it has none."""
        warm = self._warm.get(slot)
        return warm.id if warm else None

    # -- one execution ---------------------------------------------------------------------------

    def _start_exec(self, slot: int):
        import docker.errors

        for attempt in (0, 1):
            warm = self._container(slot)
            try:
                uid = self.uid_for(slot)
                exec_id = self.client.api.exec_create(
                    warm.id,
                    ["python3", "-I", "-S", "-c", LAUNCHER],
                    stdin=True,
                    stdout=True,
                    stderr=True,
                    user=f"{uid}:{uid}",
                    workdir="/tmp",
                )["Id"]
                return warm, exec_id, self.client.api.exec_start(exec_id, socket=True)
            except docker.errors.APIError as err:
                # The container died or went (pid 1 gone, removed by hand): make a new one, once.
                self._discard(slot)
                if attempt:
                    raise
                log.warning(
                    "sandbox container for slot %d unusable (%s); making a new one", slot, err
                )
        raise AssertionError("unreachable")

    def run(self, req: ExecRequest, slot: int, cancel: threading.Event | None = None) -> ExecResult:
        language = LANGUAGES[req.language]
        limits = req.limits
        payload = _payload(req, language, f"/tmp/run-{next(self._runs)}")
        _, exec_id, sock = self._open_exec(slot)
        # The wall clock starts once the container is up: a slot's replacement container (after a
        # program broke the last one) takes seconds to start on a loaded host, which is not the
        # next program's time.
        start = time.monotonic()
        deadline = start + limits.wall_timeout_ms / 1000
        ex = _Exchange(limits.max_output_bytes)
        try:
            ex.pump(getattr(sock, "_sock", sock), payload, deadline, cancel)
        except OSError as exc:
            log.warning("docker exec stream for slot %d failed: %s", slot, exc)
            ex.broken = True
        finally:
            _close_socket(sock)
        wall_ms = int((time.monotonic() - start) * 1000)
        code, sig, cpu_ms = self._outcome(slot, exec_id, ex)
        if ex.broken:
            # Never reuse a container we are not sure of; removing it kills all it holds.
            self._discard(slot)
        out, err = ex.out, ex.err
        return ExecResult(
            verdict=verdict(ex.killed_for, code, sig, cpu_ms, bytes(err.data), limits, language),
            exit_code=code,
            signal=sig,
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            wall_ms=wall_ms,
            cpu_ms=cpu_ms,
        )

    def _open_exec(self, slot: int):
        """_start_exec, with any failure but BackendUnavailable as Unavailable naming the fix."""
        try:
            return self._start_exec(slot)
        except BackendUnavailable:
            raise
        except Exception as err:
            from atgrpo.errors import Unavailable

            raise Unavailable(
                f"the docker backend cannot start an execution ({err}): {_FIX_ENGINE}"
            ) from err

    def _outcome(self, slot: int, exec_id: str, ex: _Exchange) -> tuple[int, int, int]:
        """(code, signal, cpu_ms) from the launcher's report, or from the exec's own exit status
        when it sent none; the exchange is marked broken unless the report says the container is
        clean."""
        report = ex.report
        if report is None:
            ex.broken = True
            code, sig, cpu_ms = self._exit_of(exec_id)
            if ex.frames.diag:
                log.warning(
                    "sandbox launcher in slot %d said: %s",
                    slot,
                    bytes(ex.frames.diag[-2000:]).decode(errors="replace"),
                )
            return code, sig, cpu_ms
        code, sig, cpu_ms = int(report["code"]), int(report["sig"]), int(report["cpu_ms"])
        if not report.get("clean"):
            ex.broken = True
            log.warning(
                "sandbox container for slot %d not clean after a run (%s); replacing it",
                slot,
                "; ".join(report.get("problems", [])),
            )
        return code, sig, cpu_ms

    def _exit_of(self, exec_id: str) -> tuple[int, int, int]:
        """(code, signal, cpu_ms) of an exec whose launcher did not report: its own exit status."""
        try:
            info = self.client.api.exec_inspect(exec_id)
        except Exception:  # noqa: BLE001
            return 0, signal.SIGKILL, 0
        code = info.get("ExitCode")
        if info.get("Running") or code is None:
            return 0, signal.SIGKILL, 0
        if code > 128:
            return 0, code - 128, 0
        return code, 0, 0

    def close(self) -> None:
        with self._lock:
            for slot in list(self._warm):
                self._discard(slot)

"""The local launcher: the five services as processes on free loopback ports.

`up` starts them (each binds port 0 and reports its port through a file, so there is no race for
free ports), waits until each answers its health check, and records pid, start time and address
in `<state_dir>/services.json`. `down` stops exactly those processes: a recorded pid whose start
time no longer matches (the pid was reused) is left alone.

Given a Tether (atgrpo.rpc.tether), the services stop by themselves once the process that started
them is gone, however it died: `atgrpo train` and `atgrpo eval` pass one, `atgrpo up` does not
(its services are meant to outlive it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from atgrpo.rpc.probe import probe_all
from atgrpo.rpc.tether import Tether, pass_fds_of

if TYPE_CHECKING:
    pass

log = logging.getLogger("atgrpo.cli.launcher")

STATE_FILE = "services.json"
DEFAULT_STATE_DIR = Path(os.environ.get("ATGRPO_STATE_DIR", ".atgrpo/local"))


@dataclass(frozen=True)
class ServiceProcess:
    """One process to start: a unique name, its kind (env, rollout ...) and extra flags.

    An argument "{name}" becomes the address of the service `name` of the same plan, which is
    then started first (env_svc needs the sandbox's address, for instance).
    """

    name: str
    kind: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # set in its environment, e.g. the GPUs it may use
    python: str = ""  # its interpreter; "" = the launcher's

    def needs(self) -> set[str]:
        return {a[1:-1] for a in self.args if a.startswith("{") and a.endswith("}")}


DEFAULT_SERVICES = (
    ServiceProcess("sandbox", "sandbox"),
    ServiceProcess("env", "env", ("--sandbox", "{sandbox}")),
    # Collect drives the env service, as the replicas of atgrpo.cli.runner.service_processes do;
    # without --env every run against these services fails with "this replica has no environment
    # service".
    ServiceProcess("rollout", "rollout", ("--env", "{env}")),
    ServiceProcess("trainer", "trainer"),
    ServiceProcess("router", "router"),
)


@dataclass
class LocalService:
    name: str
    kind: str
    pid: int
    create_time: float
    address: str
    metrics_address: str
    log: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # what the plan set, kept for restarts
    # seconds after boot it started (since_boot); -1: unknown (an older record)
    started: float = -1.0


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class LaunchError(RuntimeError):
    """A service did not come up; the message names it and quotes its log."""


def read_state(state_dir: Path = DEFAULT_STATE_DIR) -> list[LocalService]:
    path = Path(state_dir) / STATE_FILE
    if not path.exists():
        return []
    return [LocalService(**s) for s in json.loads(path.read_text())["services"]]


def _write_state(state_dir: Path, services: list[LocalService]) -> None:
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"services": [asdict(s) for s in services]}, indent=2))
    tmp.replace(path)


@contextlib.contextmanager
def _state_lock(state_dir: Path):
    with open(Path(state_dir) / "services.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def update_state(
    state_dir: Path, change: Callable[[list[LocalService]], list[LocalService]]
) -> list[LocalService]:
    """Read services.json, change it, write it back, under a lock: `atgrpo scale` and a run's
    Supervisor both edit it, and neither may lose the other's entries."""
    with _state_lock(state_dir):
        services = change(read_state(state_dir))
        _write_state(Path(state_dir), services)
        return services


def since_boot(pid: int) -> float:
    """When process `pid` started, in seconds after boot (-1.0 where /proc cannot say). With the
    pid it names the process. psutil's create_time is this plus the boot time, which the kernel
    derives from the wall clock: a clock adjustment moves it (here once by 49 s, 66 minutes into a
    run), and every service of a run looked dead at once to the supervisor."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19]) / _CLOCK_TICKS  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return -1.0


def _identity(pid: int) -> tuple[float, float]:
    """What a LocalService records of its process: (create_time, started)."""
    return psutil.Process(pid).create_time(), since_boot(pid)


def is_ours(svc: LocalService) -> bool:
    """True when the recorded process still runs (same pid *and* start time). A dead child of this
    process (a zombie) is reaped and counts as gone."""
    try:
        proc = psutil.Process(svc.pid)
        started = since_boot(svc.pid) if svc.started >= 0 else -1.0
        if started >= 0 and abs(started - svc.started) >= 0.01:
            return False
        if started < 0 and abs(proc.create_time() - svc.create_time) >= 0.01:
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            try:
                os.waitpid(svc.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return False
        return True
    except psutil.Error:
        return False


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _spawn(
    plan: ServiceProcess,
    state_dir: Path,
    python: str,
    addresses: dict[str, str],
    tether: Tether | None,
) -> tuple[subprocess.Popen, Path, Path, list[str]]:
    port_file = state_dir / f"{plan.name}.port.json"
    port_file.unlink(missing_ok=True)
    log_path = state_dir / "logs" / f"{plan.name}.log"
    args = [addresses[a[1:-1]] if a[1:-1] in plan.needs() else a for a in plan.args]
    argv = [
        plan.python or python,
        "-m",
        f"{plan.kind}_svc",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--port-file",
        str(port_file),
        *args,
    ]
    if tether is not None:
        argv += tether.for_kind(plan.kind)[0]
    return _popen(argv, log_path, tether, plan.kind, dict(plan.env)), port_file, log_path, argv


def _popen(
    argv: list[str],
    log_path: Path | str,
    tether: Tether | None,
    kind: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        # A new session: a Ctrl-C in the CLI's terminal is the CLI's to handle (it asks the router
        # to stop after the step); without a tether the services also outlive the CLI.
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=os.getcwd(),
            pass_fds=pass_fds_of(argv, tether, kind),
            env={**os.environ, **env} if env else None,
        )


def _await_ports(live: dict[str, tuple], deadline: float) -> dict[str, dict]:
    """Wait until at least one of the `live` processes (name -> (proc, port_file, log_path))
    reports its port; returns name -> ports for those that have."""
    while time.monotonic() < deadline:
        done = {n: json.loads(f.read_text()) for n, (_, f, _) in live.items() if f.exists()}
        if done:
            return done
        for name, (proc, _, log_path) in live.items():
            if proc.poll() is not None:
                raise LaunchError(
                    f"{name} exited with code {proc.returncode} before serving; its log "
                    f"({log_path}) ends with:\n{_log_tail(log_path)}"
                )
        time.sleep(0.05)
    raise LaunchError(
        "; ".join(
            f"{n} did not report a port within the timeout; see {lp}"
            for n, (_, _, lp) in live.items()
        )
    )


def _await_port(
    proc: subprocess.Popen, port_file: Path, log_path: Path, name: str, deadline: float
) -> dict:
    return _await_ports({name: (proc, port_file, log_path)}, deadline)[name]


def up(
    state_dir: Path = DEFAULT_STATE_DIR,
    plan: tuple[ServiceProcess, ...] = DEFAULT_SERVICES,
    *,
    timeout_s: float = 60.0,
    python: str = sys.executable,
    tether: Tether | None = None,
) -> list[LocalService]:
    """Start every service of `plan`, wait until all are healthy, record them, return them. With a
    `tether` they stop once this process is gone or the tether is closed."""
    state_dir = Path(state_dir)
    running = [s for s in read_state(state_dir) if is_ours(s)]
    if running:
        names = ", ".join(f"{s.name} (pid {s.pid})" for s in running)
        raise LaunchError(
            f"services from {state_dir} are already running: {names}; "
            f"stop them with `atgrpo down --state-dir {state_dir}` or use another directory"
        )
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    started: list[LocalService] = []
    spawned = []
    try:
        order = [p.name for p in plan]
        pending, live = list(plan), {}
        # Each service starts as soon as those it needs have reported their ports (the env once
        # the sandbox has, not once every service of the first wave has).
        while pending or live:
            addresses = {s.name: s.address for s in started}
            ready = [p for p in pending if p.needs() <= addresses.keys()]
            if not ready and not live:
                raise LaunchError(
                    f"services {[p.name for p in pending]} need addresses no plan provides"
                )
            pending = [p for p in pending if p not in ready]
            for p in ready:
                proc, port_file, log_path, argv = _spawn(p, state_dir, python, addresses, tether)
                spawned.append(proc)
                live[p.name] = (proc, port_file, log_path, p, argv)
            reported = _await_ports({n: v[:3] for n, v in live.items()}, deadline)
            for name, ports in reported.items():
                proc, _, log_path, p, argv = live.pop(name)
                started.append(record_of(p, proc, ports, log_path, argv))
            started.sort(key=lambda svc: order.index(svc.name))
            # record as we go, so `down` can clean a partial start
            _write_state(state_dir, started)
        check_healthy(started, max(1.0, deadline - time.monotonic()))
    except BaseException:
        _stop_all(started, timeout_s=5.0)
        for proc in spawned:  # those that never reported a port
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        raise
    return started


def record_of(
    plan: ServiceProcess, proc: subprocess.Popen, ports: dict, log_path: Path, argv: list[str]
) -> LocalService:
    """What services.json keeps of a process that reported its ports."""
    created, since = _identity(proc.pid)
    return LocalService(
        plan.name,
        plan.kind,
        proc.pid,
        created,
        f"127.0.0.1:{ports['port']}",
        f"127.0.0.1:{ports['metrics_port']}",
        str(log_path),
        argv,
        dict(plan.env),
        since,
    )


def check_healthy(started: list[LocalService], timeout_s: float) -> None:
    """LaunchError naming each of `started` that does not answer its health check SERVING."""
    probes = asyncio.run(probe_all([(s.kind, s.address) for s in started], timeout_s=timeout_s))
    bad = [
        f"{s.name}: {pr.health} {pr.error}"
        for s, pr in zip(started, probes, strict=True)
        if not pr.ok
    ]
    if bad:
        raise LaunchError("services not healthy: " + "; ".join(bad))


def _stop_all(services: list[LocalService], timeout_s: float) -> dict[str, str]:
    outcome: dict[str, str] = {}
    stopping = []
    for svc in services:
        if not is_ours(svc):
            outcome[svc.name] = "not running"
            continue
        try:
            # The service is its own session leader: signal its group so helpers it forked go too.
            os.killpg(svc.pid, signal.SIGTERM)
            stopping.append(svc)
        except ProcessLookupError:
            outcome[svc.name] = "not running"
    alive = _wait_gone(stopping, timeout_s)
    for svc in stopping:
        if svc in alive:
            try:
                os.killpg(svc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            outcome[svc.name] = "killed (did not stop on SIGTERM)"
        else:
            outcome[svc.name] = "stopped"
    return outcome


def _wait_gone(services: list[LocalService], timeout_s: float) -> list[LocalService]:
    """Those of `services` still running after up to `timeout_s`. A zombie counts as gone: a service
    left by a launcher that died may have a parent that never reaps it (psutil.wait_procs would wait
    the whole timeout)."""
    deadline = time.monotonic() + timeout_s
    alive = list(services)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [s for s in alive if is_ours(s)]
    return alive


def down(state_dir: Path = DEFAULT_STATE_DIR, *, timeout_s: float = 10.0) -> dict[str, str]:
    """Stop the services `up` recorded in `state_dir`; returns name -> what happened."""
    state_dir = Path(state_dir)
    outcome = _stop_all(read_state(state_dir), timeout_s)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return outcome


def _pinned(argv: list[str], svc: LocalService) -> list[str]:
    """`argv` with the ports the service had, so a restart serves at the address others know."""
    out = list(argv)
    for flag, address in (("--port", svc.address), ("--metrics-port", svc.metrics_address)):
        if flag in out:
            out[out.index(flag) + 1] = address.rsplit(":", 1)[1]
    return out


class Supervisor:
    """Restarts a local service that died, on its old ports, as Kubernetes restarts a pod behind
    its Service: the others keep its address, and their clients retry until it is back.

    At most `max_restarts` per service; services.json follows the new processes, so `down`
    stops them. Services started with a tether are restarted with the same one."""

    def __init__(
        self,
        state_dir: Path,
        *,
        max_restarts: int = 5,
        poll_s: float = 0.5,
        timeout_s: float = 120.0,
        tether: Tether | None = None,
    ):
        self.state_dir = Path(state_dir)
        self.tether = tether
        self.max_restarts, self.poll_s, self.timeout_s = max_restarts, poll_s, timeout_s
        self.restarts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="atgrpo-supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            services = read_state(self.state_dir)
            for svc in services:
                if (
                    self._stop.is_set()
                    or is_ours(svc)
                    or self.restarts.get(svc.name, 0) >= self.max_restarts
                ):
                    continue
                try:
                    new = self._restart(svc)
                except LaunchError as err:
                    log.error("could not restart %s: %s", svc.name, err)
                    continue
                # Only this entry: `atgrpo scale` may have added or removed others meanwhile. One
                # it removed (and stopped) while this restarted it stays stopped.
                now = update_state(
                    self.state_dir,
                    lambda now, old=svc, new=new: [
                        new if (s.name, s.pid) == (old.name, old.pid) else s for s in now
                    ],
                )
                if new not in now:
                    _stop_all([new], timeout_s=5.0)

    def _restart(self, svc: LocalService) -> LocalService:
        self.restarts[svc.name] = self.restarts.get(svc.name, 0) + 1
        log.warning(
            "%s (pid %d) died; restarting it on %s (restart %d)",
            svc.name,
            svc.pid,
            svc.address,
            self.restarts[svc.name],
        )
        argv = _pinned(svc.argv, svc)
        port_file = Path(argv[argv.index("--port-file") + 1])
        port_file.unlink(missing_ok=True)
        proc = _popen(argv, svc.log, self.tether, svc.kind, svc.env)  # on the same GPUs
        _await_port(proc, port_file, Path(svc.log), svc.name, time.monotonic() + self.timeout_s)
        created, since = _identity(proc.pid)
        return replace(svc, pid=proc.pid, create_time=created, argv=argv, started=since)

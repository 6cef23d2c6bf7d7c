"""`atgrpo scale POOL N --run-dir DIR`: grow or shrink a local run's rollout replicas while it
trains, as a Kubernetes autoscaler does a pool's pods.

A pool's replicas are listed in `<run_dir>/services/replicas/<pool>.txt`, the file the run's
config names (atgrpo.discovery's file targets); the router reads it before each collection.

- Up: each new replica is started like the run's own (atgrpo.cli.runner.service_processes), waited
  for until it is healthy, recorded in services.json (the run's supervisor restarts it, `atgrpo
  down` stops it) and only then listed: the router has the pool's trainer push it the current
  weights before it gets any work.
- Down: the newest replicas are first taken off the list (no new work), then out of
  services.json (not restarted), then stopped; a task one was running is collected again on
  another replica (router_svc.dispatch).

The new processes are not tied to the `atgrpo train` process (the tether is its own pipe): the
run's end stops them with the rest (they are in services.json); after a crash, `atgrpo down
--run-dir DIR` does.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

from atgrpo.cli import launcher
from atgrpo.cli.launcher import LaunchError, LocalService, ServiceProcess
from atgrpo.cli.placement import PlacementError, local_placement
from atgrpo.cli.runner import REPLICA_DIR, TrainError, service_processes, write_replica_list
from atgrpo.config import ConfigError, RunConfig, load_config
from atgrpo.discovery import read_address_file

START_S = 180.0


def _index(name: str, pool: str) -> int:
    m = re.fullmatch(rf"rollout-{re.escape(pool)}-(\d+)", name)
    return int(m.group(1)) if m else -1


def replicas_of(services: list[LocalService], pool: str) -> list[LocalService]:
    """The pool's running rollout replicas, oldest (lowest index) first."""
    mine = [s for s in services if s.kind == "rollout" and _index(s.name, pool) >= 0]
    return sorted(mine, key=lambda s: _index(s.name, pool))


def scale(run_dir: Path, pool: str, count: int, *, timeout_s: float = START_S) -> list[str]:
    """Make `pool` run `count` replicas; the addresses listed afterwards."""
    run_dir = Path(run_dir)
    state_dir = run_dir / "services"
    list_file = state_dir / REPLICA_DIR / f"{pool}.txt"
    cfg = _run_config(run_dir, pool)
    if count < 1:
        raise TrainError(f"{count} replicas: a pool needs at least 1 (to pause, stop the run)")
    if not list_file.exists():
        raise TrainError(
            f"{list_file} does not exist: {run_dir} is not a run that `atgrpo train` started "
            "locally (on Kubernetes, scale the pool's StatefulSet or let its autoscaler)"
        )
    recorded = launcher.read_state(state_dir)
    if not any(s.kind == "router" and launcher.is_ours(s) for s in recorded):
        raise TrainError(f"no local services of {run_dir} are running; start the run first")
    # Every recorded replica counts, running or not: one the supervisor is restarting is still
    # the pool's (and one removed while it restarts stays stopped: launcher.Supervisor).
    have = replicas_of(recorded, pool)
    if count > len(have):
        first = max((_index(s.name, pool) for s in have), default=-1) + 1
        added = _start(cfg, state_dir, pool, range(first, first + count - len(have)), timeout_s)
        write_replica_list(list_file, [*read_address_file(str(list_file)), *added])
    elif count < len(have):
        gone = have[count:]
        addresses = {s.address for s in gone}
        write_replica_list(
            list_file, [a for a in read_address_file(str(list_file)) if a not in addresses]
        )
        names = {s.name for s in gone}
        launcher.update_state(state_dir, lambda now: [s for s in now if s.name not in names])
        _stop(gone)
    return read_address_file(str(list_file))


def _run_config(run_dir: Path, pool: str) -> RunConfig:
    path = run_dir / "config.yaml"
    if not path.exists():
        raise TrainError(f"{path} does not exist: give the run directory of a running run")
    cfg = load_config(path)
    if pool not in cfg.pools:
        raise TrainError(f"the run has no pool {pool!r}; its pools: {', '.join(cfg.pools)}")
    return cfg


def _start(
    cfg: RunConfig, state_dir: Path, pool: str, indices: range, timeout_s: float
) -> list[str]:
    """Start replicas `indices` of `pool`, wait until each is healthy, record them; addresses."""
    grown = replace(
        cfg,
        pools={**cfg.pools, pool: replace(cfg.pools[pool], rollout_replicas=indices.stop)},
    )
    try:
        plans = service_processes(grown, local_placement(grown))
    except PlacementError as err:
        raise TrainError(
            f"{indices.stop} replicas of {pool!r} do not fit this machine: {err}"
        ) from None
    wanted = {f"rollout-{pool}-{i}" for i in indices}
    known = {s.name: s.address for s in launcher.read_state(state_dir)}
    started: list[LocalService] = []
    try:
        for plan in (p for p in plans if p.name in wanted):
            started.append(_spawn(plan, state_dir, known, time.monotonic() + timeout_s))
        launcher.check_healthy(started, timeout_s)
    except BaseException:
        _stop(started)
        raise
    launcher.update_state(state_dir, lambda now: [*now, *started])
    return [s.address for s in started]


def _spawn(
    plan: ServiceProcess, state_dir: Path, known: dict[str, str], deadline: float
) -> LocalService:
    proc, port_file, log_path, argv = launcher._spawn(
        plan, state_dir, sys.executable, known, tether=None
    )
    try:
        ports = launcher._await_port(proc, port_file, log_path, plan.name, deadline)
    except LaunchError:
        proc.kill()
        raise
    return launcher.record_of(plan, proc, ports, log_path, argv)


def _stop(services: list[LocalService]) -> None:
    """SIGTERM (a replica ends its streams), SIGKILL after 10 s."""
    launcher._stop_all(services, timeout_s=10.0)


def add_command(sub: argparse._SubParsersAction) -> None:
    sc = sub.add_parser(
        "scale",
        help="grow or shrink a local run's rollout replicas while it trains (new ones get the "
        "current weights before any work; removed ones' tasks are collected elsewhere)",
    )
    sc.add_argument("pool", help="the pool whose replicas to scale")
    sc.add_argument("replicas", type=int, help="how many it should run")
    sc.add_argument("--run-dir", type=Path, required=True, help="the running run's directory")
    sc.add_argument("--timeout-s", type=float, default=180.0, help="how long a start may take")
    sc.set_defaults(fn=_cmd_scale)


def _cmd_scale(args: argparse.Namespace) -> int:
    try:
        listed = scale(args.run_dir, args.pool, args.replicas, timeout_s=args.timeout_s)
    except (TrainError, LaunchError, ConfigError) as err:
        print(f"atgrpo scale: {err}", file=sys.stderr)
        return 1
    print(f"{args.pool}: {len(listed)} replicas: {' '.join(listed)}")
    return 0

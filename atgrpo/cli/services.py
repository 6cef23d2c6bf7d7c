"""`atgrpo up`, `status` and `down`: the local services as commands (atgrpo.cli.launcher starts,
watches and stops them)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from atgrpo.cli.launcher import (
    DEFAULT_SERVICES,
    DEFAULT_STATE_DIR,
    LaunchError,
    LocalService,
    down,
    read_state,
    up,
)
from atgrpo.rpc.probe import STUBS, probe_all

if TYPE_CHECKING:
    from atgrpo.config import RunConfig


def add_command(sub: argparse._SubParsersAction) -> None:
    def state(p: argparse.ArgumentParser, timeout: float) -> argparse.ArgumentParser:
        p.add_argument(
            "--state-dir",
            type=Path,
            default=DEFAULT_STATE_DIR,
            help="where `up` records the services it started (env ATGRPO_STATE_DIR)",
        )
        p.add_argument("--timeout-s", type=float, default=timeout)
        return p

    start = state(sub.add_parser("up", help="start the five services locally"), 60.0)
    start.add_argument(
        "config",
        type=Path,
        nargs="?",
        help="a run config: start the services it needs (its pools on the rollouts and trainers, "
        "as `atgrpo train` would) and print the services: block for `atgrpo train --connect`",
    )
    start.set_defaults(fn=_cmd_up)
    probe = state(sub.add_parser("status", help="health and version of each service"), 3.0)
    probe.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="KIND=HOST:PORT",
        help="probe these instead of the local ones (repeatable)",
    )
    probe.add_argument("--json", action="store_true")
    probe.set_defaults(fn=_cmd_status)
    stop = state(
        sub.add_parser("down", help="stop the services `up` started, or those a run left behind"),
        10.0,
    )
    stop.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="stop the local services of the run in this directory (`atgrpo train` or `eval` "
        "recorded them in RUN_DIR/services) that are still running",
    )
    stop.set_defaults(fn=_cmd_down)


def _cmd_up(args: argparse.Namespace) -> int:
    plan, cfg = DEFAULT_SERVICES, None
    if args.config is not None:
        from atgrpo.cli.preflight import load_for_run
        from atgrpo.cli.runner import TrainError, check_models, resolve_paths, service_processes

        cfg = load_for_run(args, "up")
        if cfg is None:
            return 2
        try:
            cfg = resolve_paths(cfg)
            check_models(cfg)
        except TrainError as err:
            print(f"atgrpo up: {err}", file=sys.stderr)
            return 1
        # what `atgrpo train CONFIG` would start: its pools, --env on every rollout
        plan = service_processes(cfg)
    try:
        services = up(args.state_dir, plan, timeout_s=args.timeout_s)
    except LaunchError as err:
        print(f"atgrpo up failed: {err}", file=sys.stderr)
        return 1
    for s in services:
        print(f"{s.name:<8} {s.address:<22} pid {s.pid:<7} metrics {s.metrics_address}")
    print(f"{len(services)} services up; state in {args.state_dir}; stop them with `atgrpo down`")
    if cfg is not None:
        _print_services_block(args.config, cfg, services)
    else:
        print(
            "the rollout service serves no model pool: to train against these services, start them "
            "with the run's config instead (`atgrpo up CONFIG`)",
            file=sys.stderr,
        )
    return 0


def _print_services_block(config: Path, cfg: RunConfig, services: list[LocalService]) -> None:
    """The services: block that points `atgrpo train CONFIG --connect` at these services."""
    import yaml

    from atgrpo.cli.runner import with_services

    block = {"services": with_services(cfg, services).to_dict()["services"]}
    print(f"\n# add to {config}, then `atgrpo train {config} --connect`:")
    print(yaml.safe_dump(block, sort_keys=False, default_flow_style=False), end="")


def _parse_addresses(pairs: list[str]) -> list[tuple[str, str]]:
    targets = []
    for pair in pairs:
        kind, sep, address = pair.partition("=")
        if not sep or kind not in STUBS:
            raise SystemExit(
                f"--address {pair!r}: expected KIND=HOST:PORT with KIND one of {sorted(STUBS)}"
            )
        targets.append((kind, address))
    return targets


def _cmd_status(args: argparse.Namespace) -> int:
    if args.address:
        targets = [(k, k, a) for k, a in _parse_addresses(args.address)]
    else:
        targets = [(s.name, s.kind, s.address) for s in read_state(args.state_dir)]
        if not targets:
            print(
                f"no services recorded in {args.state_dir}: run `atgrpo up`, or pass --address "
                f"KIND=HOST:PORT",
                file=sys.stderr,
            )
            return 1
    probes = asyncio.run(probe_all([(k, a) for _, k, a in targets], timeout_s=args.timeout_s))
    if args.json:
        print(
            json.dumps(
                [{"name": n, **vars(p)} for (n, _, _), p in zip(targets, probes, strict=True)],
                indent=2,
            )
        )
    else:
        for (name, _, _), p in zip(targets, probes, strict=True):
            extra = p.error or p.instance
            print(f"{name:<8} {p.address:<22} {p.health:<12} {p.version or '-':<8} {extra}")
    return 0 if all(p.ok for p in probes) else 1


def _cmd_down(args: argparse.Namespace) -> int:
    # A run's local services are recorded in its run directory (atgrpo.cli.runner.LocalServices).
    state_dir = args.run_dir / "services" if args.run_dir is not None else args.state_dir
    services = {s.name: s for s in read_state(state_dir)}
    outcome = down(state_dir, timeout_s=args.timeout_s)
    if not outcome:
        print(f"no services recorded in {state_dir}")
    for name, what in outcome.items():
        print(f"{name:<8} pid {services[name].pid:<7} {what}")
    return 0

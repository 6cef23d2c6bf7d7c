"""Sandbox throughput: executions per second of a short Python program, each backend against a
bare subprocess measured in the same run (the baseline: no isolation, no limits).

    python bench/sandbox.py [--seconds 5] [--concurrency N]

Target (sandbox issue): the isolated backend at >= 0.8x the bare throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record, sandbox_uid_base  # noqa: E402

from atgrpo.contract.sandbox import ExecRequest, Verdict  # noqa: E402
from atgrpo.rpc.server import create_server  # noqa: E402
from sandbox_svc.backends import BackendUnavailable, make_backend  # noqa: E402
from sandbox_svc.client import SandboxClient  # noqa: E402
from sandbox_svc.executor import Executor  # noqa: E402
from sandbox_svc.policy import Policy, check_exec  # noqa: E402
from sandbox_svc.server import bindings  # noqa: E402

PROGRAM = "import sys\nn = int(sys.stdin.readline())\nprint(sum(i * i for i in range(n)))\n"
STDIN = b"1000\n"
EXPECTED = str(sum(i * i for i in range(1000))).encode() + b"\n"


def _timed(fn, seconds: float, concurrency: int) -> float:
    """Executions per second of `fn()` called from `concurrency` threads for `seconds`."""
    fn()  # warm-up (starts warm sandboxes, fills caches)
    done = [0] * concurrency
    stop = time.monotonic() + seconds

    def worker(i):
        while time.monotonic() < stop:
            fn(i)
            done[i] += 1

    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return sum(done) / (time.monotonic() - start)


def bare(seconds: float, concurrency: int) -> float:
    work = tempfile.mkdtemp()
    Path(work, "main.py").write_text(PROGRAM)

    def once(_slot=0):
        out = subprocess.run(
            ["/usr/bin/python3", "-I", "-B", "main.py"],
            input=STDIN,
            cwd=work,
            capture_output=True,
            env={"PATH": "/usr/bin"},
        )
        assert out.stdout == EXPECTED, out

    return _timed(once, seconds, concurrency)


def backend_direct(name: str, seconds: float, concurrency: int) -> float:
    policy = Policy()
    backend = make_backend(name, policy, uid_base=sandbox_uid_base(concurrency))
    req = check_exec(ExecRequest("python", PROGRAM, STDIN), policy)

    def once(slot=0):
        r = backend.run(req, slot)
        assert r.verdict is Verdict.OK and r.stdout == EXPECTED, r

    try:
        return _timed(once, seconds, concurrency)
    finally:
        backend.close()


def over_grpc(seconds: float, concurrency: int) -> float:
    async def go():
        executor = Executor(
            make_backend("bwrap", Policy(), uid_base=sandbox_uid_base(concurrency)),
            workers=concurrency,
            queue=concurrency,
        )
        running = await create_server(bindings(executor))
        async with SandboxClient(f"127.0.0.1:{running.port}") as c:
            await c.execute(PROGRAM, stdin=STDIN)
            done, stop = 0, time.monotonic() + seconds

            async def worker():
                nonlocal done
                while time.monotonic() < stop:
                    r = await c.execute(PROGRAM, stdin=STDIN)
                    assert r.stdout == EXPECTED
                    done += 1

            start = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            rate = done / (time.monotonic() - start)
        await running.stop(0)
        executor.close()
        return rate

    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=os.cpu_count() or 1)
    args = parse_args(ap, smoke={"seconds": 0.5})
    rows = [("bare subprocess (baseline)", bare(args.seconds, args.concurrency))]
    rows.append(("bwrap backend", backend_direct("bwrap", args.seconds, args.concurrency)))
    rows.append(("bwrap via gRPC Execute", over_grpc(args.seconds, args.concurrency)))
    try:
        rows.append(("docker backend", backend_direct("docker", args.seconds, args.concurrency)))
    except (ImportError, BackendUnavailable) as err:
        print(f"docker backend not measured: {err}")
        rows.append(("docker backend", float("nan")))
    base = rows[0][1]
    print(f"sandbox throughput, {args.concurrency} concurrent, {args.seconds:g} s each")
    print(f"{'backend':<28} {'exec/s':>8} {'vs bare':>8}")
    for name, rate in rows:
        ratio = "n/a" if rate != rate else f"{rate / base:.2f}x"
        print(f"{name:<28} {rate:8.1f} {ratio:>8}")
        if rate == rate and name != rows[0][0]:
            record(
                "sandbox",
                f"{name} exec/s vs bare subprocess",
                rate / base,
                f"{rate:.0f} vs {base:.0f} exec/s",
            )


if __name__ == "__main__":
    main()

"""Rollout throughput, in one run: tokens/s through Generate over gRPC against the engine called
in-process, and n=K shared-prefix generation against K separate calls.

    python bench/rollout.py [--size tiny|small] [--k 8] [--tokens 64] [--requests 8]

Targets (rollout issue): gRPC >= 0.9x in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record  # noqa: E402

from atgrpo.contract.sampling import Sampling  # noqa: E402
from atgrpo.models import build_tiny_model  # noqa: E402
from atgrpo.rpc.server import create_server  # noqa: E402
from rollout_svc.client import RolloutClient  # noqa: E402
from rollout_svc.engines.hf import HFEngine  # noqa: E402
from rollout_svc.pool import PoolRuntime  # noqa: E402
from rollout_svc.replica import Replica  # noqa: E402
from rollout_svc.server import bindings  # noqa: E402

PROMPT = [
    {"role": "user", "content": "Plan a path from the top left to the bottom right of a 6x6 grid."}
]


def _tokens(gens) -> int:
    return sum(len(c.token_ids) for g in gens for c in g.completions)


async def main_async(args) -> None:
    model = build_tiny_model(Path(tempfile.mkdtemp()) / "m", size=args.size)
    engine = HFEngine(str(model), device=args.device, dtype="float32")
    engine.warm_up()
    s = Sampling(temperature=1.0, max_tokens=args.tokens)
    pool = PoolRuntime("p", engine)
    replica = Replica({"p": pool})
    prompt, _ = engine.render(PROMPT, 2048)

    async def in_process():
        return await asyncio.gather(
            *(replica.generate_prompt("p", "", prompt, s, args.k) for _ in range(args.requests))
        )

    running = await create_server(bindings(replica, None))
    async with RolloutClient(f"127.0.0.1:{running.port}") as client:

        async def over_grpc():
            return await asyncio.gather(
                *(
                    client.generate("p", prompt_ids=prompt, sampling=s, n=args.k)
                    for _ in range(args.requests)
                )
            )

        rows = []
        for name, fn in (("in-process", in_process), ("gRPC Generate", over_grpc)):
            await fn()  # warm-up
            best = 0.0
            for _ in range(args.repeats):
                t = time.perf_counter()
                gens = await fn()
                best = max(best, _tokens(gens) / (time.perf_counter() - t))
            rows.append((name, best))
    await running.stop(0)

    def shared(k):  # one call, one prefill, k samples -> completions
        return engine.generate([prompt], [k], s)[0]

    def separate(k):  # k calls of one sample each
        return [engine.generate([prompt], [1], s)[0][0] for _ in range(k)]

    prefix_rows = []
    for name, fn in ((f"n={args.k}, one prefill", shared), (f"{args.k} separate calls", separate)):
        fn(args.k)
        best = 0.0
        for _ in range(args.repeats):
            t = time.perf_counter()
            toks = sum(len(c.token_ids) for c in fn(args.k))
            best = max(best, toks / (time.perf_counter() - t))
        prefix_rows.append((name, best))

    print(
        f"rollout, {args.size} model on {engine.device}: {args.requests} requests x n={args.k} x "
        f"{args.tokens} tokens"
    )
    print(f"{'path':<28} {'tok/s':>9} {'ratio':>7}")
    for name, rate in rows:
        print(f"{name:<28} {rate:9.0f} {rate / rows[0][1]:6.2f}x")
    for name, rate in prefix_rows:
        print(f"{name:<28} {rate:9.0f} {rate / prefix_rows[1][1]:6.2f}x")
    record(
        "rollout",
        "Generate tok/s, gRPC vs in-process",
        rows[-1][1] / rows[0][1],
        f"{rows[-1][1]:.0f} vs {rows[0][1]:.0f} tok/s",
    )
    record(
        "rollout",
        f"n={args.k} shared prefill vs {args.k} calls",
        prefix_rows[0][1] / prefix_rows[1][1],
        f"{prefix_rows[0][1]:.0f} vs {prefix_rows[1][1]:.0f} tok/s",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    asyncio.run(
        main_async(parse_args(ap, smoke={"k": 2, "tokens": 4, "requests": 2, "repeats": 1}))
    )


if __name__ == "__main__":
    main()

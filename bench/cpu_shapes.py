"""What this CPU's matrix units give at the shapes a small model's rollout and update run (issue
55, item 2): GFLOP/s of each projection of SmolLM2-135M (576 wide, 1536 MLP, 3 of 9 heads' keys
and values, a 49,152-token head) at a decode step's rows and at an update's positions, in bf16
and float32, as nn.Linear runs them (x @ W^T) and with the weight stored transposed (x @ W);
and the decode step's attention (one query over the cached positions). Each figure beside the
rate of a large square matmul in the same dtype measured in the same run: what the library does
at its best here, so the share says how far a shape falls short of it.

    python bench/cpu_shapes.py [--rows 32] [--positions 2048] [--context 400] [--seconds 0.3]

Name the CPU with every figure (some machines here have AMX, some avx512_bf16, some only AVX2).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench._report import parse_args, record  # noqa: E402

# SmolLM2-135M: (name, in, out) of each of a layer's projections, and the head.
HIDDEN, MLP, KV, HEADS, HEAD_DIM, VOCAB = 576, 1536, 192, 9, 64, 49152
PROJECTIONS = (
    ("q, o", HIDDEN, HIDDEN),
    ("k, v", HIDDEN, KV),
    ("gate, up", HIDDEN, MLP),
    ("down", MLP, HIDDEN),
    ("head", HIDDEN, VOCAB),
)
REFERENCE = 1024  # the square matmul the shares are of
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def rate(fn: Callable[[], object], flops: float, seconds: float) -> float:
    """GFLOP/s of `fn`: the best of short trials over about `seconds` (contention from another
    process lowers one trial, not the figure)."""
    for _ in range(2):  # allocation and kernel choice
        fn()
    best, end = 0.0, time.perf_counter() + seconds
    while True:
        start, calls = time.perf_counter(), 0
        while calls < 1 or time.perf_counter() - start < seconds / 5:
            fn()
            calls += 1
        best = max(best, flops * calls / (time.perf_counter() - start) / 1e9)
        if time.perf_counter() > end:
            return best


def linear_rates(
    rows: int, fan_in: int, fan_out: int, dtype: torch.dtype, seconds: float
) -> tuple[float, float]:
    """(as nn.Linear: x @ W^T with W (out, in); with W stored (in, out): x @ W) in GFLOP/s."""
    x = torch.randn(rows, fan_in, dtype=dtype)
    w = torch.randn(fan_out, fan_in, dtype=dtype)
    wt = w.t().contiguous()
    flops = 2.0 * rows * fan_in * fan_out
    return rate(lambda: F.linear(x, w), flops, seconds), rate(lambda: x @ wt, flops, seconds)


def attention_rate(rows: int, context: int, dtype, seconds: float) -> float:
    """A decode step's attention: one query a row over `context` cached positions, 9 query heads
    on 3 key/value heads (expanded, as transformers' sdpa path does), in GFLOP/s."""
    q = torch.randn(rows, HEADS, 1, HEAD_DIM, dtype=dtype)
    k = torch.randn(rows, HEADS, context, HEAD_DIM, dtype=dtype)
    v = torch.randn(rows, HEADS, context, HEAD_DIM, dtype=dtype)
    flops = 4.0 * rows * HEADS * context * HEAD_DIM
    return rate(lambda: F.scaled_dot_product_attention(q, k, v), flops, seconds)


def measure(args: argparse.Namespace) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, dtype in DTYPES.items():
        a = torch.randn(REFERENCE, REFERENCE, dtype=dtype)
        ref = rate(lambda a=a: a @ a, 2.0 * REFERENCE**3, args.seconds)
        shapes = {}
        for where, rows in (("decode", args.rows), ("update", args.positions)):
            for proj, fan_in, fan_out in PROJECTIONS:
                shapes[f"{where} {proj}"] = linear_rates(rows, fan_in, fan_out, dtype, args.seconds)
        out[name] = {
            "reference": ref,
            "shapes": shapes,
            "attention": attention_rate(args.rows, args.context, dtype, args.seconds),
        }
    return out


def cpu_name() -> str:
    """The CPU's model name and its matrix instructions, as /proc/cpuinfo says."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    units = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"{model or platform.machine()} ({', '.join(units) or 'no avx2'})"


def report(m: dict[str, dict], args: argparse.Namespace) -> None:
    print(
        f"{cpu_name()}, {torch.get_num_threads()} torch threads; "
        f"decode {args.rows} rows, update {args.positions} positions, attention over "
        f"{args.context} positions"
    )
    for name, r in m.items():
        ref = r["reference"]
        print(f"\n{name}: {REFERENCE}^3 matmul {ref:.0f} GFLOP/s (the shares below are of it)")
        print(f"  {'shape':<18} {'x @ W^T':>9} {'share':>6} {'x @ W':>9} {'share':>6}")
        for shape, (linear, plain) in r["shapes"].items():
            print(
                f"  {shape:<18} {linear:9.0f} {linear / ref:6.0%} {plain:9.0f} {plain / ref:6.0%}"
            )
        att = r["attention"]
        print(f"  {'decode attention':<18} {att:9.1f} {att / ref:6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32, help="a decode step's rows")
    ap.add_argument("--positions", type=int, default=2048, help="an update micro-batch's positions")
    ap.add_argument("--context", type=int, default=400, help="the decode's cached positions")
    ap.add_argument("--seconds", type=float, default=0.3, help="per figure")
    args = parse_args(ap, {"rows": 8, "positions": 64, "context": 32, "seconds": 0.02})
    m = measure(args)
    report(m, args)
    bf16, fp32 = m["bf16"], m["fp32"]
    record(
        "cpu_shapes",
        "bf16 / fp32 GFLOP/s, large square matmul",
        bf16["reference"] / fp32["reference"],
    )
    for where in ("decode", "update"):
        mlp = bf16["shapes"][f"{where} gate, up"][0]
        record(
            "cpu_shapes",
            f"bf16 {where} MLP projection (x @ W^T) / large square matmul",
            mlp / bf16["reference"],
            f"{mlp:.0f} of {bf16['reference']:.0f} GFLOP/s",
        )


if __name__ == "__main__":
    main()

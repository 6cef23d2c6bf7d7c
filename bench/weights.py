"""Weight sync, in one run: a full-weight push of a ~1 GiB model to 2 rollout replicas (separate
processes, hf engine) against a raw gRPC byte stream of the same size to 2 servers that only
count the bytes, on the same loopback; memory and responsiveness during the push; and the LoRA
hot-swap latency beside it.

    python bench/weights.py [--gib 1.0] [--repeats 3]

Reported (weight-sync issue; targets in brackets):
- push GB/s (bytes per replica / seconds until both acknowledged, load included) against the raw
  stream's [>= 0.8x], raw streams and pushes alternated: the best push from the third on (a
  training run's steady state: the replica reuses the memory of the push before last), and the
  first two (into fresh memory) beside it;
- peak RSS growth during a push over the model's bytes, on each replica and the sender [<= 1.5];
- the longest health-check answer of a replica during the pushes, asked every 10 ms from a
  process of its own as a kubelet would [< 100 ms], and the longest stall of the sender's event
  loop;
- an adapter-only push (LoRA on q/k/v/o of the same model) at rank 8, 16 and 64: its bytes and
  median time, against the full push's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record  # noqa: E402

CHUNK = 4 * 2**20
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 2**20),
    ("grpc.max_send_message_length", 64 * 2**20),
]


# --- the raw baseline: a server that counts the bytes of one client stream ------------------


def raw_server(port_file: str) -> None:
    import grpc
    from grpc import aio

    async def put(requests, context):
        n = 0
        async for data in requests:
            n += len(data)
        return n.to_bytes(8, "little")

    async def serve():
        server = aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "raw.Sink", {"Put": grpc.stream_unary_rpc_method_handler(put)}
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(json.dumps({"port": port}))
        await server.wait_for_termination()

    asyncio.run(serve())


async def raw_stream(addresses: list[str], total: int) -> float:
    """Seconds to stream `total` bytes to every address at once, in CHUNK messages."""
    from grpc import aio

    block = os.urandom(CHUNK)
    channels = [aio.insecure_channel(a, options=GRPC_OPTIONS) for a in addresses]

    async def blocks():
        for i in range(0, total, CHUNK):
            yield block[: min(CHUNK, total - i)]

    start = time.perf_counter()
    counts = await asyncio.gather(*(c.stream_unary("/raw.Sink/Put")(blocks()) for c in channels))
    seconds = time.perf_counter() - start
    assert all(int.from_bytes(n, "little") == total for n in counts)
    for c in channels:
        await c.close()
    return seconds


# --- processes and measurements ----------------------------------------------------------------


def start(
    argv: list[str], port_file: Path, log: Path, address: bool = True
) -> tuple[subprocess.Popen, str]:
    """Start `argv` and wait for it to write `port_file` (its port, when `address`)."""
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.monotonic() + 600
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{argv[:4]} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, f"127.0.0.1:{json.loads(port_file.read_text())['port']}" if address else ""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Samples the processes' resident memory every 5 ms from a thread."""

    def __init__(self, pids: list[int]):
        self.pids, self.base = pids, [rss(p) for p in pids]
        self.peak = list(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = [max(p, rss(pid)) for p, pid in zip(self.peak, self.pids, strict=True)]

    def growth(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return [p - b for p, b in zip(self.peak, self.base, strict=True)]


def probe(addresses: str, out: str) -> None:
    """Health-check every replica every 10 ms from a process of its own (as a kubelet does, so the
    sender's own stalls are not counted as the replica's) until SIGTERM; then write each call's
    (start, end) on the system's monotonic clock to `out`."""
    import signal

    from rollout_svc.client import RolloutClient

    calls: list[tuple[float, float]] = []

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        clients = [RolloutClient(a) for a in addresses.split(",")]

        async def health(c):
            while not stop.is_set():
                t = time.monotonic()
                await c.health()
                calls.append((t, time.monotonic()))
                await asyncio.sleep(0.01)

        Path(out + ".ready").touch()
        await asyncio.gather(*(health(c) for c in clients))
        Path(out).write_text(json.dumps(calls))

    asyncio.run(run())


def longest_answer(calls: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """The longest health call (ms) that overlapped a push."""
    return max(
        [(e - s) * 1000 for s, e in calls if any(s < w1 and e > w0 for w0, w1 in windows)],
        default=0.0,
    )


async def loop_stall(stop: asyncio.Event) -> float:
    """The longest stall of this event loop (ms) until `stop`."""
    worst = 0.0
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.005)
        worst = max(worst, (time.perf_counter() - t - 0.005) * 1000)
    return worst


def build_model(where: Path, gib: float) -> Path:
    """A Qwen2-shaped model of about `gib` GiB in float32 (the tiny model's tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from atgrpo.models import build_tiny_model

    model = build_tiny_model(where, size="tiny")
    cfg = AutoConfig.from_pretrained(model)
    hidden = 2048 if gib >= 0.25 else 256
    per_layer = 4 * hidden * hidden + 3 * hidden * (hidden * 23 // 8)
    layers = max(1, round(gib * 2**30 / 4 / per_layer))
    cfg.update(
        dict(
            hidden_size=hidden,
            intermediate_size=hidden * 23 // 8,
            num_attention_heads=16,
            num_key_value_heads=16,
            head_dim=hidden // 16,
            num_hidden_layers=layers,
            layer_types=["full_attention"] * layers,
        )
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(model)
    return model


LORA_RANKS = (8, 16, 64)


def adapter(model_dir: Path, rank: int):
    """A LoRA adapter of the model at `rank` on q/k/v/o (atgrpo's default targets), PEFT's
    format."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(rank)
    cfg = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)
    return dict(get_peft_model_state_dict(model)), json.loads(
        json.dumps(cfg.to_dict(), default=list)
    )


async def metered(run, pids: list[int]):
    """Seconds `run()` took, its window on the monotonic clock, each process's peak RSS growth and
    the event loop's longest stall: the raw stream and the push are measured alike."""
    meter, stop = PeakRSS(pids), asyncio.Event()
    watcher = asyncio.create_task(loop_stall(stop))
    await asyncio.sleep(0.05)
    t, t0 = time.perf_counter(), time.monotonic()
    await run()
    seconds, window = time.perf_counter() - t, (t0, time.monotonic())
    stop.set()
    return seconds, window, meter.growth(), await watcher


async def pushes(args, replicas: list[str], sinks: list[str], state: dict, pids: list[int]):
    """Raw streams and pushes alternated (a noisy host drifts; both get the same drift). From the
    third push on a replica's pushes arrive in memory already written (rollout_svc.weights.Staging),
    as every push of a training run but its first two does."""
    from rollout_svc.client import RolloutClient, push_weights

    size = sum(
        v.numel() * v.element_size() for v in {v.data_ptr(): v for v in state.values()}.values()
    )
    raw, first, best, growth, lag_ms, sent, windows = [], [], [], [0] * len(pids), 0.0, 0, []
    for version in range(1, args.repeats + 3):
        raw.append((await metered(lambda: raw_stream(sinks, size), pids))[0])

        async def push(version=version):
            nonlocal sent
            sent = await push_weights(replicas, [("", state, None)], "p", version)

        seconds, window, grown, lag = await metered(push, pids)
        (best if version > 2 else first).append(seconds)
        windows.append(window)
        lag_ms = max(lag_ms, lag)
        growth = [max(g, n) for g, n in zip(growth, grown, strict=True)]
    lora = {}
    async with RolloutClient(replicas[0]) as c:
        for rank in LORA_RANKS:  # an adapter a rank: a served adapter keeps its rank
            state, cfg = adapter(args.model, rank)
            swaps = []
            for version in range(args.repeats + 2):
                t = time.perf_counter()
                await c.load_weights(state, "l", version, adapter=f"rank{rank}", adapter_config=cfg)
                swaps.append((time.perf_counter() - t) * 1000)
            lora[rank] = (
                sorted(swaps)[len(swaps) // 2],
                sum(v.numel() * v.element_size() for v in state.values()),
            )
    return dict(
        size=size,
        raw=min(raw),
        seconds=min(best),
        first=min(first),
        bytes=sent // len(replicas),
        growth=growth,
        windows=windows,
        lag_ms=lag_ms,
        lora=lora,
    )


def stop_probe(proc: subprocess.Popen, out: Path, windows: list[tuple[float, float]]) -> float:
    proc.terminate()
    proc.wait(timeout=60)
    if not out.exists():
        raise SystemExit(
            f"the health probe wrote nothing:\n{Path(str(out) + '.log').read_text()[-3000:]}"
        )
    return longest_answer(json.loads(out.read_text()), windows)


async def main_async(
    args,
    replicas: list[str],
    sinks: list[str],
    pids: list[int],
    prober: tuple[subprocess.Popen, Path],
) -> None:
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(args.model).state_dict()
    got = await pushes(args, replicas, sinks, state, pids)
    size, raw = got["size"], got["raw"]
    got["health_ms"] = stop_probe(*prober, got["windows"])
    raw_gbs, push_gbs = size / raw / 1e9, got["bytes"] / got["seconds"] / 1e9
    print(f"model {size / 2**30:.2f} GiB, 2 replicas, best of {args.repeats} (after 2 pushes)")
    print(f"{'raw gRPC byte stream':<34} {raw_gbs:6.2f} GB/s per replica")
    print(
        f"{'full-weight push (load included)':<34} {push_gbs:6.2f} GB/s per replica   "
        f"{push_gbs / raw_gbs:.2f}x"
    )
    first_gbs = got["bytes"] / got["first"] / 1e9
    print(
        f"{'  its first two, into fresh memory':<34} {first_gbs:6.2f} GB/s per replica   "
        f"{first_gbs / raw_gbs:.2f}x"
    )
    grow = [g / size for g in got["growth"]]
    print(
        f"peak RSS growth / model: sender {grow[0]:.2f}, replicas {grow[1]:.2f} and {grow[2]:.2f}"
    )
    print(
        f"longest health answer {got['health_ms']:.1f} ms, longest sender loop stall "
        f"{got['lag_ms']:.1f} ms"
    )
    swaps = "; ".join(
        f"rank {r}: {ms:.0f} ms ({n / 2**20:.1f} MiB)" for r, (ms, n) in got["lora"].items()
    )
    print(f"LoRA adapter push (q/k/v/o, one replica, median): {swaps}")
    detail = f"{push_gbs:.2f} vs {raw_gbs:.2f} GB/s, {size / 2**30:.2f} GiB"
    record(
        "weights",
        "full push GB/s vs raw gRPC stream, 2 replicas (>= 0.8)",
        push_gbs / raw_gbs,
        detail,
    )
    record(
        "weights",
        "peak RSS growth / model, worst replica (<= 1.5)",
        max(grow[1:]),
        f"sender {grow[0]:.2f}",
    )
    top = max(LORA_RANKS)
    record(
        "weights",
        f"LoRA rank-{top} adapter push time / full push time",
        got["lora"][top][0] / 1000 / got["seconds"],
        swaps,
    )
    record(
        "weights",
        "longest health answer during a push / 100 ms (< 1)",
        max(got["health_ms"], 0.1) / 100,
        f"{got['health_ms']:.1f} ms; sender loop stall {got['lag_ms']:.1f} ms",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--raw-server", help=argparse.SUPPRESS)
    ap.add_argument("--probe", nargs=2, help=argparse.SUPPRESS)
    if "--raw-server" in sys.argv:
        return raw_server(ap.parse_args().raw_server)
    if "--probe" in sys.argv:
        return probe(*ap.parse_args().probe)
    args = parse_args(ap, {"gib": 0.02, "repeats": 1})
    tmp = Path(tempfile.mkdtemp(prefix="atgrpo-bench-weights-"))
    args.model = build_model(tmp / "big", args.gib)
    env = {**os.environ, "ATGRPO_LOG_LEVEL": "WARNING"}
    os.environ.update(env)
    procs, replicas, sinks = [], [], []
    try:
        for i in range(2):
            pools = ["--pool", f"p={args.model}"] + (
                ["--pool", f"l={args.model}:lora"] if i == 0 else []
            )
            proc, address = start(
                [
                    sys.executable,
                    "-m",
                    "rollout_svc",
                    *pools,
                    "--engine",
                    "hf",
                    "--device",
                    "cpu",
                    "--dtype",
                    "float32",
                    "--port",
                    "0",
                    "--port-file",
                    str(tmp / f"r{i}.json"),
                ],
                tmp / f"r{i}.json",
                tmp / f"r{i}.log",
            )
            procs.append(proc)
            replicas.append(address)
            proc, address = start(
                [sys.executable, __file__, "--raw-server", str(tmp / f"s{i}.json")],
                tmp / f"s{i}.json",
                tmp / f"s{i}.log",
            )
            procs.append(proc)
            sinks.append(address)
        out = tmp / "health.json"
        prober, _ = start(
            [sys.executable, __file__, "--probe", ",".join(replicas), str(out)],
            Path(str(out) + ".ready"),
            Path(str(out) + ".log"),
            address=False,
        )
        procs.append(prober)
        asyncio.run(
            main_async(
                args, replicas, sinks, [os.getpid(), procs[0].pid, procs[2].pid], (prober, out)
            )
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()

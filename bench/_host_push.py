"""One rank of the host-memory measurement of a push from an FSDP pool (bench/trainer_memory.py
and tests/trainer/test_host_push.py run it):

    torchrun --nproc-per-node 2 bench/_host_push.py OUT HIDDEN LAYERS VOCAB

Each rank builds the same random Qwen3-shaped model (float32 masters, untied head) and shards it
with FSDP2's bf16 mixed precision, as a bf16 pool is. Then, twice on the same weights, what a push
does on the trainer before the bytes leave: the whole model onto rank 0's CPU in bf16 and laid out
as the push's payload (atgrpo.contract.weight_payload.Payload, every chunk digested):
- "device": sharding.host_state, each tensor cast where it lives, then gathered (the new path);
- "host": torch's get_model_state_dict(full_state_dict, cpu_offload), the float32 model on rank
  0's CPU, then cast there (the path it replaces), the baseline.
Rank 0's peak: Linux's high-water mark of its resident set (VmHWM), reset to the current size
(/proc/self/clear_refs) before each, minus the resident set then; run with MALLOC_MMAP_THRESHOLD_
at 64 KiB so freed tensors leave the resident set. Rank 0 writes both peaks, both times, the
model's float32 and bf16 bytes, its largest tensor's, and whether the two payloads are the same
bits (every tensor equal, the same digest) to OUT as JSON."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from atgrpo.contract.weight_payload import Payload  # noqa: E402
from trainer_svc.sharding import host_state, shard  # noqa: E402


def status_bytes(key: str) -> int:
    """A /proc/self/status memory line (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak() -> int:
    """The resident set now, with the high-water mark reset to it."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")


def gather_then_cast(model, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The replaced path: the float32 model gathered whole onto rank 0's CPU, then cast there
    (tied weights cast once), as state.PoolState.full_state did."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    cast: dict[int, torch.Tensor] = {}
    return {k: cast.setdefault(v.data_ptr(), v.to(dtype)) for k, v in full.items()}


def build(hidden: int, layers: int, vocab: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)  # every rank the same weights
    cfg = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        num_hidden_layers=layers,
        vocab_size=vocab,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).float()


def measure(fn, rank: int) -> tuple[dict, float, int, Payload | None]:
    """(state, seconds, rank 0's peak growth, payload): `fn` gathers, then the payload is laid
    out and every chunk cut and digested, as a push's first stream does."""
    before = reset_peak()
    start = time.perf_counter()
    state = fn()
    payload = None
    if rank == 0:
        payload = Payload(state)
        for k in range(payload.num_chunks):
            payload.wire(k)
    seconds = time.perf_counter() - start
    return state, seconds, status_bytes("VmHWM") - before, payload


def main(out: str, hidden: int, layers: int, vocab: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(hidden, layers, vocab)
    fp32 = sum(p.numel() * 4 for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    shard(model, "cpu", mixed_bf16=True)
    new, new_s, new_peak, new_payload = measure(lambda: host_state(model, torch.bfloat16), rank)
    new_digest = new_payload.digest() if new_payload is not None else ""
    del new_payload
    old, old_s, old_peak, old_payload = measure(
        lambda: gather_then_cast(model, torch.bfloat16), rank
    )
    if rank == 0:
        same = list(new) == list(old) and all(
            new[k].dtype == old[k].dtype and torch.equal(new[k], old[k]) for k in new
        )
        Path(out).write_text(
            json.dumps(
                {
                    "device_peak": new_peak,
                    "host_peak": old_peak,
                    "device_s": new_s,
                    "host_s": old_s,
                    "fp32_bytes": fp32,
                    "bf16_bytes": fp32 // 2,
                    "largest_fp32_bytes": largest,
                    "same_tensors": same,
                    "same_digest": new_digest == old_payload.digest(),
                    "dtypes": sorted({str(v.dtype) for v in new.values()}),
                }
            )
        )
    dist.barrier()  # leave together (tests/trainer/dist_worker.py says why)
    dist.destroy_process_group()


def push_host(args) -> None:
    """bench/trainer_memory.py's section 4: this file's main on two gloo ranks under torchrun,
    one thread each; prints the figures and records the ratios."""
    import socket
    import subprocess

    from _report import record

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"atgrpo-host-push-{os.getpid()}.json"
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    dims = [str(args.push_hidden), str(args.push_layers), str(args.push_vocab)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    proc = subprocess.run(
        [*cmd, __file__, str(out), *dims],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"push: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    got = json.loads(out.read_text())
    out.unlink()
    mb = 1e6
    print(
        f"\npush from an FSDP bf16 pool, 2 gloo ranks (hidden {args.push_hidden}, "
        f"{args.push_layers} layers, vocabulary {args.push_vocab}: "
        f"{got['fp32_bytes'] / mb:.0f} MB float32, {got['bf16_bytes'] / mb:.0f} MB bf16, largest "
        f"tensor {got['largest_fp32_bytes'] / mb:.0f} MB float32); rank 0's VmHWM above its "
        "resident set before"
    )
    for name, key in (
        ("gathered, then cast on the host", "host"),
        ("cast, then gathered", "device"),
    ):
        print(f"  {name:<34} peak {got[key + '_peak'] / mb:7.0f} MB   {got[key + '_s']:6.2f} s")
    print(f"  same tensors: {got['same_tensors']}, same digest: {got['same_digest']}")
    if not (got["same_tensors"] and got["same_digest"]):
        raise RuntimeError("the two paths pushed different bits")
    detail = f"{got['host_peak'] / mb:.0f} vs {got['device_peak'] / mb:.0f} MB"
    record(
        "trainer_memory",
        "push host peak, gathered then cast / cast then gathered",
        got["host_peak"] / got["device_peak"],
        f"{detail}; payload {got['bf16_bytes'] / mb:.0f} MB",
    )
    record(
        "trainer_memory",
        "push gather+cast+layout seconds, gathered then cast / cast then gathered",
        got["host_s"] / got["device_s"],
        f"{got['host_s']:.2f} vs {got['device_s']:.2f} s",
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown of gloo (dist_worker.py)

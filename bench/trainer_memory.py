"""Trainer memory at Qwen3's vocabulary (151,936) and Qwen3-1.7B's hidden size, on CPU, in one run:

1. the log-prob and loss path (the decoder's last hidden state -> output layer -> sampling
   transform -> log-softmax -> gather -> policy loss -> backward), its peak memory per response
   token: the full-logits path (at token counts this machine holds) against the chunked one
   (trainer_svc/logprobs.py; target: under 1 GiB at 8,192 response tokens);
2. activation bytes per token per layer, with and without gradient checkpointing (HF's,
   non-reentrant), at Qwen3-1.7B's layer dimensions (hidden 2048, intermediate 6144, 16 heads,
   8 kv heads, head_dim 128);
3. the update's tokens/s, chunked against full logits (target >= 0.9x), on a few-layer model of
   1.7B's hidden size and Qwen3's vocabulary;
4. a push from an FSDP bf16 pool over 2 gloo ranks (bench/_host_push.py): rank 0's host peak and
   seconds to gather, cast and lay out the payload, each tensor cast before it is gathered
   (sharding.host_state) against the float32 model gathered onto the host and cast there (the
   path it replaced), on the same weights, with the payloads' bits compared.

How memory is measured: every figure comes from a fresh subprocess (so nothing another
measurement allocated or fragmented counts), with glibc returning every freed block over 64 KiB to
the system (MALLOC_MMAP_THRESHOLD_), so the resident set follows torch's CPU allocations. A peak is
Linux's high-water mark of the resident set (VmHWM), reset to the current
size (/proc/self/clear_refs)
just before the measured step, minus the resident set then: weights, their gradients (allocated
beforehand: they are the planner's per-model figure, not per token) and the inputs are not in it.
The chunked path's backward adds the output layer's weight gradient into that preallocated .grad
pass by pass (trainer_svc/fused_head.py, _FusedHeadLogprobs), so its peak holds no (V, H) tensor:
what it holds is one pass's logits temporaries (the top-k / top-p transform's sort and softmaxes,
about ten 64 MiB float32 tensors at 2**24 elements) plus a few (tokens, hidden) tensors.
Activations are the resident set held after the forward (the autograd graph alive) minus before it,
the difference between a 3-layer and a 1-layer model, per layer and per token.

The figures at full size are float32 matmuls of 151,936 rows: about 10 minutes on 2 idle cores,
most of it the chunked path at 8,192 tokens (four output-layer matmuls per token: the forward, the
backward's recompute, and the two gradient products).

    python bench/trainer_memory.py [--full-tokens 128,256] [--chunked-tokens 256,8192] [--repeats 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _host_push import push_host, reset_peak, status_bytes  # noqa: E402
from _report import parse_args, record  # noqa: E402

from atgrpo.algo.loss import policy_loss  # noqa: E402
from atgrpo.contract.sampling import Sampling  # noqa: E402
from atgrpo.contract.trainer import LossConfig, TrainSample, UpdateConfig  # noqa: E402

GiB = 2**30
# The GPU examples' training transform at its heaviest (top-k and top-p: the sort's temporaries).
SAMPLING = Sampling(temperature=1.0, top_k=20, top_p=0.9)
ROWS = 8  # responses per micro-batch in the log-prob measurement


def qwen3(args, layers: int, vocab: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        num_hidden_layers=layers,
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    )
    return Qwen3ForCausalLM(cfg).float()


# ---- measurements, each in its own subprocess -------------------------------------------------


def measure_logprobs(args, path: str, tokens: int) -> dict:
    """Peak of the log-prob and loss path from the last hidden state, forward and backward."""
    from trainer_svc.logprobs import hidden_logprobs, logits_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    torch.nn.init.normal_(head.weight, std=0.02)
    # Written, not only allocated: untouched zero pages would join the resident set mid-measurement.
    head.weight.grad = torch.ones_like(head.weight).zero_()
    t = tokens // ROWS
    hidden = torch.randn(ROWS, t, args.hidden).requires_grad_()
    hidden.grad = torch.ones_like(hidden).zero_()
    targets = torch.randint(0, args.vocab, (ROWS, t))
    mask = torch.ones(ROWS, t)
    samplings = {SAMPLING: list(range(ROWS))}
    adv = torch.randn(ROWS)
    before = reset_peak()
    start = time.perf_counter()
    if path == "chunked":
        lp, ent = hidden_logprobs(head, hidden, targets, mask, samplings, entropy="metric")
    else:
        lp, ent = logits_logprobs(head(hidden), targets, mask, samplings, entropy="grad")
    loss, _ = policy_loss(lp, lp.detach(), adv, mask, LossConfig(), entropy=ent)
    loss.backward()
    seconds = time.perf_counter() - start
    return {"peak": status_bytes("VmHWM") - before, "seconds": seconds}


def measure_activations(args, checkpointing: bool) -> dict:
    """Bytes the forward keeps for the backward, per layer: a 3-layer model less a 1-layer one."""
    held = {}
    models = {n: qwen3(args, n, vocab=args.act_vocab) for n in (1, 3)}
    ids = torch.randint(0, args.act_vocab, (1, args.act_tokens))
    for n, model in models.items():
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        # a first pass allocates the gradients and torch's lazy state
        for measured in (
            False,
            True,
        ):
            before = reset_peak()
            out = model(input_ids=ids, use_cache=False)
            if measured:
                held[n] = status_bytes("VmRSS") - before
            out.logits.float().sum().backward()
            del out
    return {"per_token_layer": (held[3] - held[1]) / 2 / args.act_tokens}


def run_child(args, what: str, **kw) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, __file__, "--child", json.dumps({"what": what, **kw}), *sys.argv[1:]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} {kw}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the update's throughput, in this process ------------------------------------------------


def update_rates(args) -> tuple[float, float]:
    """tokens/s of one update (forward, backward, AdamW step), chunked and with full logits."""
    import trainer_svc.logprobs as logprobs
    import trainer_svc.update as upd

    model = qwen3(args, args.update_layers, vocab=args.vocab)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    g = torch.Generator().manual_seed(0)
    samples = [
        TrainSample(
            "a",
            torch.randint(3, args.vocab, (args.prompt,), generator=g).tolist(),
            torch.randint(3, args.vocab, (args.response,), generator=g).tolist(),
            [-12.0] * args.response,
            float(torch.randn(1, generator=g)),
            Sampling(temperature=1.0),
        )
        for _ in range(args.samples)
    ]
    cfg = UpdateConfig(mini_batch_size=args.samples)
    settings = upd.TrainerUpdateSettings(args.samples * (args.prompt + args.response))
    tokens = args.samples * args.response
    chunked = upd.response_logprobs
    keep = logprobs.LOGPROB_KEEP_ELEMENTS
    rates = {}
    try:
        # "recomputed": the log-probs not kept for the backward (as at any micro-batch over
        # LOGPROB_KEEP_ELEMENTS logits): one more output-layer matmul per token.
        for name, fn, kept in (
            ("full", functools.partial(chunked, full_logits=True), keep),
            ("chunked", chunked, keep),
            ("recomputed", chunked, 0),
        ):
            upd.response_logprobs = fn
            logprobs.LOGPROB_KEEP_ELEMENTS = kept
            upd.update(model, optimizer, samples, cfg, params=params, settings=settings)  # warm-up
            best = 0.0
            for _ in range(args.repeats):
                t = time.perf_counter()
                upd.update(model, optimizer, samples, cfg, params=params, settings=settings)
                best = max(best, tokens / (time.perf_counter() - t))
            rates[name] = best
    finally:
        upd.response_logprobs = chunked
        logprobs.LOGPROB_KEEP_ELEMENTS = keep
    return rates["chunked"], rates["full"], rates["recomputed"]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--full-tokens", default="128,256", help="response tokens for the full-logits path"
    )
    ap.add_argument(
        "--chunked-tokens", default="256,8192", help="response tokens for the chunked path"
    )
    ap.add_argument("--act-tokens", type=int, default=256)
    ap.add_argument(
        "--act-vocab", type=int, default=1024, help="small: the activations are the layers'"
    )
    ap.add_argument("--update-layers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--push-hidden", type=int, default=1024, help="section 4's model")
    ap.add_argument("--push-layers", type=int, default=12)
    ap.add_argument("--push-vocab", type=int, default=32000)
    args = parse_args(
        ap,
        smoke={
            "vocab": 4096,
            "hidden": 128,
            "intermediate": 384,
            "heads": 4,
            "kv_heads": 2,
            "head_dim": 32,
            "full_tokens": "64",
            "chunked_tokens": "64",
            "act_tokens": 512,
            "act_vocab": 256,
            "update_layers": 1,
            "samples": 2,
            "prompt": 8,
            "response": 64,
            "repeats": 1,
            "push_hidden": 256,
            "push_layers": 2,
            "push_vocab": 4096,
        },
    )
    if args.child:
        job = json.loads(args.child)
        what = job.pop("what")
        out = (
            measure_logprobs(args, **job)
            if what == "logprobs"
            else measure_activations(args, **job)
        )
        print(json.dumps(out))
        return

    print(f"vocabulary {args.vocab}, hidden {args.hidden}, float32, CPU; sampling {SAMPLING}")
    print("\nlog-prob and loss path, forward + backward, peak above weights, gradients and inputs")
    print(f"{'path':<12} {'tokens':>7} {'peak MiB':>9} {'bytes/token':>12} {'seconds':>8}")
    per_token = {}
    peaks = {}
    for path, sizes in (("full", _ints(args.full_tokens)), ("chunked", _ints(args.chunked_tokens))):
        for tokens in sizes:
            m = run_child(args, "logprobs", path=path, tokens=tokens)
            per_token[path] = m["peak"] / tokens
            peaks[path, tokens] = m["peak"]
            print(
                f"{path:<12} {tokens:7d} {m['peak'] / 2**20:9.0f} {m['peak'] / tokens:12.0f} "
                f"{m['seconds']:8.2f}"
            )
    biggest = max(_ints(args.chunked_tokens))
    chunked_peak = peaks["chunked", biggest]
    print(
        f"chunked peak at {biggest} tokens: {chunked_peak / GiB:.2f} GiB "
        f"({'under' if chunked_peak < GiB else 'OVER'} the 1 GiB target)"
    )
    # Per token at the largest size each path ran: the full path's grows with the tokens, the
    # chunked one's is one pass's whatever the tokens.
    full_at = max(_ints(args.full_tokens))
    full_per_token = peaks["full", full_at] / full_at
    chunked_per_token = chunked_peak / biggest
    record(
        "trainer_memory",
        f"log-prob+loss peak bytes/token, full logits / chunked ({full_at} vs {biggest} tok)",
        full_per_token / chunked_per_token,
        f"{full_per_token:.0f} vs {chunked_per_token:.0f} B/token",
    )

    print(
        f"\nactivations kept for the backward, per token per layer ({args.act_tokens} tokens, "
        f"hidden {args.hidden}, intermediate {args.intermediate}, {args.heads} heads, "
        f"{args.kv_heads} kv heads, head_dim {args.head_dim})"
    )
    act = {
        ckpt: run_child(args, "activations", checkpointing=ckpt)["per_token_layer"]
        for ckpt in (False, True)
    }
    for ckpt, v in act.items():
        print(
            f"  gradient checkpointing {'on ' if ckpt else 'off'}: {v / 1024:8.1f} KiB/token/layer"
        )
    record(
        "trainer_memory",
        "activations/token/layer, no checkpointing / checkpointing",
        act[False] / max(act[True], 1.0),
        f"{act[False] / 1024:.1f} vs {act[True] / 1024:.1f} KiB",
    )

    push_host(args)

    chunked, full, recomputed = update_rates(args)
    print(
        f"\nupdate, {args.update_layers}-layer model, {args.samples} x ({args.prompt} + "
        f"{args.response}) tokens, AdamW: chunked {chunked:.0f} tok/s, full logits {full:.0f} "
        f"tok/s, ratio {chunked / full:.2f}x (target >= 0.9x)"
    )
    print(
        f"  chunked with the log-probs recomputed in the backward (micro-batches over the keep "
        f"budget): {recomputed:.0f} tok/s, ratio {recomputed / full:.2f}x (on a "
        f"{args.update_layers}-layer model the output layer is most of the work; at 1.7B's 28 "
        f"layers its extra matmul is a few per cent)"
    )
    record(
        "trainer_memory",
        f"update tok/s chunked / full logits, {args.update_layers}-layer",
        chunked / full,
        f"{chunked:.0f} vs {full:.0f} tok/s",
    )
    record(
        "trainer_memory",
        f"update tok/s chunked, log-probs recomputed / full logits, {args.update_layers}-layer",
        recomputed / full,
        f"{recomputed:.0f} vs {full:.0f} tok/s",
    )


if __name__ == "__main__":
    main()

"""The prepared GPU check (issue 19): one run, at most ~8 minutes on one GPU, that writes a JSON
report.

Each part runs in a process of its own (a crash or an out-of-memory in one keeps the others'
figures, and each part's host peak and CUDA reserve are its own), and only where the wheels it
needs are importable: a bare GPU machine has torch and CUDA and no internet, so the report says
which wheels to carry for the parts it skipped (NEEDS; about 60 MB can be carried).

1. trainer: the trainer at a real size: a randomly initialised model of Qwen3-1.7B's
   configuration (the architecture config the repository carries; nothing is downloaded) is saved
   locally, loaded by the trainer's own code (PoolOps: float32 masters under bf16 autocast,
   gradient checkpointing as the pool says) and updated at the example's settings (its dtype,
   micro_batch_tokens, mini_batch_size, lr). It reports the update's tokens/s, its MFU (the
   trainer's FLOPs against the matmul rate it measures at setup) and the peak device memory
   (allocated and reserved), against `atgrpo plan`'s estimate for the same pool; and the same
   budget again on samples of unequal lengths (padded) under the example's top-k / top-p. No grpc.
2. logprobs: step 0's check that catches an engine/trainer mismatch: the rollout engine (hf, in
   the rollout's dtype) samples with the example's sampling transform (top-k, top-p), and the
   trainer scores the same tokens as its update's first forward does (the pool's dtype, bf16
   autocast). Per token, exp(trainer - rollout) should be ~1; on equal prompts and on prompts of
   unequal lengths batched together (padded). No grpc.
3. services: 3 steps of the toy L1 loop (tiny model, hf engine) with the rollout and the
   trainer on the device, through all five services (`python -m atgrpo.cli train`).
4. push: weight sync (issue 20): the same random model served by an hf-engine replica on the
   device, a full-weight push into it over loopback gRPC (GB/s, peak host and device memory), and
   the engine's generation tokens/s there, with the example's sampling; beside it the same bytes
   over a plain gRPC stream in the same run, and the push's rate as a ratio of that.
5. vllm: vLLM against the trainer on the logprobs part's prompts, and a reload push into a vLLM
   replica; only where vLLM imports (`--vllm-python`: the interpreter that has it), else
   "skipped: vllm not importable", which does not fail the check.
6. two_gpu: torchrun over two ranks (FSDP, one update, a push, a DCP save and resume); only with
   >= 2 GPUs, else skipped with the count it saw (not a failure); `--device cpu` runs it on gloo.
Parts 1 and 2 live in gpu_check_trainer.py, 3 and 4 in gpu_check_services.py, 5 and 6 in
gpu_check_parts.py (and gpu_check_two_gpu.py, one rank); what they share (the random model, the
example's pool, PoolOps set up as the trainer service sets it up) in gpu_check_fixtures.py, and
what each needs installed (the wheels to carry) in gpu_check_wheels.py. This file runs each part
in a process of its own and writes the report.

    python scripts/gpu_check.py                                   # on a GPU machine
    python scripts/gpu_check.py --device cpu --size small --out /tmp/check.json  # smoke (make test)
    python scripts/gpu_check.py --wheels                          # what to carry to a bare machine

The services part also needs bubblewrap on PATH (the sandbox's backend): a Debian 12 /usr/bin/bwrap
ran on the H200 image (Ubuntu 24.04, gVisor) as carried. docs/gpu_check/ holds the reports of runs
on GPU machines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# the check's other modules, beside this file (sys.path[0] when it runs as a script)
import gpu_check_fixtures as fixtures
import gpu_check_parts as parts
from gpu_check_fixtures import ALLOC_CONF, ROOT, _peak
from gpu_check_services import check_push, check_services
from gpu_check_trainer import check_logprobs, check_trainer
from gpu_check_wheels import imported_wheels, missing_wheels, wheels

sys.path.insert(0, str(ROOT))  # the tree's packages, which the parts import


PARTS = ("trainer", "logprobs", "services", "push", "vllm", "two_gpu")
# Parts that run only where what they need is there (vLLM; two GPUs): skipped, they do not fail
# the check, and the report says why (gpu_check_parts).
WHERE_AVAILABLE = ("vllm", "two_gpu")
# The parts that run the trainer: run_part gives them the CUDA allocator setting its service runs
# with (ALLOC_CONF).
TRAINS = ("trainer", "logprobs", "two_gpu")


CHECKS = {
    "trainer": check_trainer,
    "logprobs": check_logprobs,
    "services": check_services,
    "push": check_push,
    "vllm": lambda args, work: parts.check_vllm(args, work, fixtures),
    "two_gpu": lambda args, work: parts.check_two_gpu(args, work, fixtures),
}


def run_part(args) -> dict:
    """One part, in this process: its figures, the wheels it imported and its host peak."""
    if args.part in TRAINS:  # as the trainer service runs (trainer_svc/__main__.py), before torch
        os.environ.setdefault(*ALLOC_CONF)
    if absent := parts.unavailable(args.part, args):  # vLLM, a second GPU: before the wheels
        return absent
    missing = missing_wheels(args.part)
    if missing:
        return {
            "skipped": f"needs the wheels {missing}: carry them to this machine (pip download on "
            f"one with "
            "internet; `--wheels` lists every part's)"
        }
    # The services start the sandbox, whose default backend is bubblewrap; a GPU image has none.
    if args.part == "services" and not shutil.which("bwrap"):
        return {
            "skipped": "needs bubblewrap for the sandbox service: carry a bwrap binary (e.g. "
            "/usr/bin/bwrap of a machine that has it) and put its folder first on PATH"
        }
    try:
        out = CHECKS[args.part](args, Path(args.work))
    except Exception as err:  # noqa: BLE001 - reported, not raised: the report is the product
        out = {"error": f"{type(err).__name__}: {err}"}
    # a part's own children (two_gpu's ranks) report the wheels they imported too
    wheels = sorted(set(imported_wheels()) | set(out.pop("wheels", ())))
    return {**out, "host_peak_bytes": _peak("cpu"), "wheels": wheels}


def run_isolated(part: str, args, work: Path) -> dict:
    """A part in a process of its own (see the module's docstring); its report, or what killed
    it."""
    out = work / f"{part}.json"
    settings = {
        "--device": args.device,
        "--size": args.size,
        "--example": args.example,
        "--micro-batch-tokens": args.micro_batch_tokens,
        "--dtype": args.dtype,
        "--sample-tokens": args.sample_tokens,
        "--loop-steps": args.loop_steps,
        "--loop-timeout-s": args.loop_timeout_s,
        "--gen-tokens": args.gen_tokens,
        "--part-timeout-s": args.part_timeout_s,
        "--part": part,
        "--work": work,
        "--out": out,
    }
    # -S passed on: a check run without site-packages (a bare machine's emulation) stays so.
    # the vllm part on the interpreter that has vLLM (the rollout image's; .venv-vllm here)
    python = args.vllm_python if part == "vllm" and args.vllm_python else sys.executable
    cmd = [
        python,
        *(["-S"] if sys.flags.no_site else []),
        __file__,
        *(str(x) for kv in settings.items() for x in kv),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.part_timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past --part-timeout-s {args.part_timeout_s}"}
    if out.exists():
        return json.loads(out.read_text())
    return {"error": f"exit {done.returncode} with no report: {done.stderr[-2000:]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=("1.7b", "small"), default="1.7b")
    ap.add_argument(
        "--example",
        default=str(ROOT / "examples/code_L1_gpu.yaml"),
        help="the config whose first pool's settings (and first agent's sampling) the parts use",
    )
    ap.add_argument(
        "--micro-batch-tokens", type=int, default=0, help="override the example's (0: keep it)"
    )
    ap.add_argument("--dtype", default="", help="override the example pool's dtype ('': keep it)")
    ap.add_argument(
        "--sample-tokens", type=int, default=2048, help="prompt + response tokens of each sample"
    )
    ap.add_argument("--loop-steps", type=int, default=3)
    ap.add_argument("--loop-timeout-s", type=int, default=300)
    ap.add_argument(
        "--gen-tokens", type=int, default=64, help="tokens per sequence of the generation checks"
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to run")
    ap.add_argument("--part-timeout-s", type=int, default=600)
    ap.add_argument(
        "--vllm-python",
        default="",
        help="the interpreter the vllm part runs on (one where vLLM imports; default: this one)",
    )
    ap.add_argument(
        "--wheels",
        action="store_true",
        help="print the wheels each part needs beyond torch, and exit",
    )
    ap.add_argument("--out", default="gpu_check.json")
    # run one part here (run_isolated)
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.wheels:
        print(json.dumps(wheels(), indent=2))
        return 0
    if args.part:
        Path(args.out).write_text(json.dumps(run_part(args), indent=2))
        return 0
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := sorted(set(chosen) - set(PARTS)):
        ap.error(f"--parts: {unknown} are not parts; use some of {','.join(PARTS)}")
    report: dict = {"device": args.device, "size": args.size}
    try:
        import torch

        report["torch"] = torch.__version__
        if args.device.startswith("cuda"):
            report["gpu"] = torch.cuda.get_device_name(0)
    except Exception as err:  # noqa: BLE001 - reported, not raised: the report is the product
        report["error"] = f"torch: {err}"
    with tempfile.TemporaryDirectory(prefix="atgrpo-gpu-check-") as tmp:
        for part in chosen:
            report[part] = run_isolated(part, args, Path(tmp))
            # after each part: a timeout keeps what ran
            Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n".join(parts.summary(report)))
    return 0 if all(part_ok(part, report[part], args) for part in chosen) else 1


def part_ok(part: str, got: dict, args) -> bool:
    """A part passed: it ran without error (a skipped part did not: the check could not run it).
    The log-prob comparison is a measurement: how far apart the two may be is the reader's call."""
    if "skipped" in got:  # vLLM or a second GPU absent: said so, not a failure
        return part in WHERE_AVAILABLE and bool(got.get("unavailable"))
    if "error" in got:
        return False
    if part == "services":
        return got.get("exit_code") == 0 and got.get("steps") == args.loop_steps
    return True


if __name__ == "__main__":
    sys.exit(main())

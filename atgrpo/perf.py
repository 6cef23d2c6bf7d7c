"""Where a step's compute goes: the FLOPs of a forward, a generation and an update, counted from the
model's size (pure functions), this process's own matmul rate measured once, and a clock that
sums wall time by phase. Both rollout_svc (generation) and trainer_svc (the update) use it, so
their FLOP/s and their ratio to the measured matmul rate (a "MFU" against what this machine
actually does, not a datasheet) are counted alike (docs/observability.md, "A step's time").

FLOPs are model FLOPs, as MFU counts them: 2 per multiply-add of a matmul weight per token
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1), attention's
score matmuls and every elementwise op left out (small next to the weights at these lengths), and
work done twice by choice (gradient checkpointing's second forward, the chunked log-prob head's
recomputed logits, a decode step of a finished row) not counted: it is overhead the FLOP/s show.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelSize:
    """A model's matmul weights as the FLOP count needs them.

    `body`: the parameters every position passes through (the decoder's linear layers, LoRA's
    included); `head`: the output layer's (vocabulary x hidden), which runs only at the positions
    whose logits are computed. The input embedding is a lookup, not a matmul: in neither.
    `body_trainable` / `head_trainable`: those of them that get a gradient."""

    body: int = 0
    head: int = 0
    body_trainable: int = 0
    head_trainable: int = 0


def forward_flops(size: ModelSize, tokens: int, head_tokens: int) -> float:
    """One forward over `tokens` positions, `head_tokens` of which go through the output layer:
    2 FLOPs per weight per position."""
    return 2.0 * (size.body * tokens + size.head * head_tokens)


def backward_flops(size: ModelSize, tokens: int, head_tokens: int) -> float:
    """The backward of that forward: the activations' gradients cost what the forward did (2 per
    weight per position, through every layer, frozen or not), and each trainable weight's
    gradient 2 more per position. Full fine-tuning: 4N per token; a frozen base with LoRA: about
    2N."""
    activations = forward_flops(size, tokens, head_tokens)
    weights = 2.0 * (size.body_trainable * tokens + size.head_trainable * head_tokens)
    return activations + weights


def update_flops(size: ModelSize, tokens: int, head_tokens: int) -> float:
    """Forward and backward: ~6N per token for full fine-tuning, ~4N for a frozen base with LoRA."""
    return forward_flops(size, tokens, head_tokens) + backward_flops(size, tokens, head_tokens)


def generation_flops(
    size: ModelSize, prompts: int, prefill_tokens: int, decode_tokens: int
) -> float:
    """Sampling: a prefill of `prefill_tokens` prompt positions whose logits are kept at each
    prompt's last position only (`prompts` of them), then one forward of one position per decoded
    token, each with its logits."""
    return forward_flops(size, prefill_tokens, prompts) + forward_flops(
        size, decode_tokens, decode_tokens
    )


def model_size(model: torch.nn.Module) -> ModelSize:
    """The ModelSize of a transformers model (a PEFT one too): every nn.Linear's weight and bias,
    the output layer (`get_output_embeddings()`) apart. A model with no nn.Linear (GPT-2's Conv1D)
    counts every parameter but the embeddings as body. Parameters on the meta device count too."""
    get_head = getattr(model, "get_output_embeddings", None)
    head_module = get_head() if callable(get_head) else None
    sizes = dict.fromkeys(("body", "head", "body_trainable", "head_trainable"), 0)
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        part = "head" if module is head_module else "body"
        for p in (module.weight, module.bias):
            if p is None:
                continue
            sizes[part] += p.numel()
            if p.requires_grad:
                sizes[f"{part}_trainable"] += p.numel()
    if not sizes["body"]:
        embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        rest = [p for p in model.parameters() if id(p) not in embeddings]
        sizes["body"] = sum(p.numel() for p in rest)
        sizes["body_trainable"] = sum(p.numel() for p in rest if p.requires_grad)
    return ModelSize(**sizes)


# The shapes the rate is measured with. CPU: one projection of a small model's batch (256 positions
# of SmolLM2-135M's 576 wide into its 1536 MLP), as a rollout or an update runs them; the figure in
# DESIGN.md section 5 (~115 GFLOP/s in float32 on two EPYC cores) is this one through torch's
# matmul (MKL); oneDNN's packed linear runs it at ~230 a core. GPU: large enough to
# keep the tensor cores busy, where a small one would measure kernel launches.
_CPU_SHAPE = (256, 576, 1536)
_GPU_SHAPE = (8192, 8192, 8192)
# The update's reference on a CPU: a 1024^3 square, which the matrix units run at their best
# (bench/cpu_shapes.py holds every projection against it). An update's projections run at ~2048
# rows, at 94-103% of it in bf16; _CPU_SHAPE's 256 rows do not (in bf16 on an EPYC with
# avx512_bf16: 30-105 GFLOP/s from one trial to the next against 145 for the square, two busy
# cores), and held against that an update's mfu read 2-5x too high and varied with the moment the
# trainer measured it.
UPDATE_CPU_SHAPE = (1024, 1024, 1024)


@functools.cache
def matmul_rate(
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    seconds: float = 0.2,
    shape: tuple[int, int, int] | None = None,
) -> float:
    """FLOP/s of one (M, K) @ (K, N) matmul in `dtype` on `device`, in this process as it is set up
    (its torch threads): the best of several short trials over about `seconds`, so a moment of
    contention from another process lowers one trial, not the figure. `shape`: (M, K, N), by
    default the device's (_CPU_SHAPE, _GPU_SHAPE). On a CPU, the better of torch's matmul and
    oneDNN's linear on a packed weight, which the hf engine runs (in float32 on an AMD EPYC 2.3x
    torch's matmul, MKL there). Measured once per process (cached): a service calls it when it
    starts, before it serves. 0.0 when it cannot run here."""
    try:
        dev = torch.device(device)
        if dev.type not in ("cpu", "cuda") or (
            dev.type == "cuda" and not torch.cuda.is_available()
        ):
            return 0.0
        m, k, n = shape or (_GPU_SHAPE if dev.type == "cuda" else _CPU_SHAPE)
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        best = _best_rate(lambda: a @ b, 2.0 * m * k * n, seconds, sync)
        if dev.type == "cpu":
            # the hf engine's packed oneDNN linear (rollout_svc.engines.hf_packed): in float32 on
            # an AMD CPU 2.3x torch's matmul, which runs MKL there; the rate is the better one
            best = max(best, _packed_rate(a, b, seconds))
        return best
    except (RuntimeError, TypeError, ValueError):  # a device or dtype this process cannot use
        return 0.0


def packable(dtype: torch.dtype) -> bool:
    """Whether this process's oneDNN runs a linear on a packed weight in `dtype` on CPU
    (rollout_svc.engines.hf_packed): float32 wherever oneDNN is built in, bf16 where the CPU has
    its instructions."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def _packed_rate(a: torch.Tensor, b: torch.Tensor, seconds: float) -> float:
    """FLOP/s of a @ b as oneDNN's linear on b packed once; 0.0 where it cannot run."""
    if not packable(a.dtype):
        return 0.0
    packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), a.shape[0])
    flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    return _best_rate(
        lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""),
        flops,
        seconds,
        lambda: None,
    )


def _best_rate(op, flops: float, seconds: float, sync) -> float:
    """The best of several short trials of `op` (of `flops`) over about `seconds`."""
    for _ in range(2):  # the first calls pay for allocation and kernel choice
        op()
    sync()
    best, trials, end = 0.0, 0, time.perf_counter() + seconds
    while trials < 3 or (time.perf_counter() < end and trials < 50):
        start, calls = time.perf_counter(), 0
        while calls < 1 or time.perf_counter() - start < seconds / 5:
            op()
            calls += 1
            sync()
        best = max(best, flops * calls / (time.perf_counter() - start))
        trials += 1
    return best


class PhaseClock:
    """Wall seconds summed by phase name. On a CUDA device each phase synchronizes at its start and
    end, so the seconds are the work's and not the kernel launches' (one synchronize per phase:
    cheap next to a forward or a backward)."""

    def __init__(self, device: str = "cpu"):
        self.seconds: dict[str, float] = defaultdict(float)
        self._cuda = str(device).startswith("cuda") and torch.cuda.is_available()

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start

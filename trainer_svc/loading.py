"""How a pool's model is loaded: the dtypes it is held, computed and handed out in, gradient
checkpointing, and, on a sharded pool, a start-up that holds one full copy on rank 0 only.

Mixed precision (`dtype: bfloat16`, which `auto` is on a bf16-capable GPU): the trainable weights,
their gradients and AdamW's state stay float32 (the master weights) and forward/backward run
under torch.autocast(bfloat16). AdamW stepping bfloat16 weights directly loses most of a small
update to rounding (measured: 10 steps at lr 5e-6 moved 13x less than float32, and 92.5% of the
weights not at all). What leaves the trainer, weight pushes and the checkpoint's model folder,
keeps the dtype it had before: bfloat16 for `dtype: bfloat16`. A LoRA pool's frozen base needs no
master copy, so it stays in bfloat16; PEFT keeps its adapters float32 (autocast_adapter_dtype).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from atgrpo.attention import use_gqa_sdpa
from atgrpo.contract.trainer import PoolSpec
from atgrpo.errors import InvalidArgument

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_dtype(dtype: str, device: str) -> str:
    """`auto`: bfloat16 on a bf16-capable GPU, else float32, in full, as `atgrpo plan` counts it:
    float32 masters under autocast, a LoRA pool's frozen base and what leaves the trainer in bf16
    (an `auto` LoRA base was float32 on GPUs, twice what the plan counted)."""
    if dtype != "auto":
        return dtype
    bf16 = (
        device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    )
    return "bfloat16" if bf16 else "float32"


def compute_bf16(spec: PoolSpec, device: str) -> bool:
    """Whether forward/backward run under bf16 autocast (over float32 master weights)."""
    return resolve_dtype(spec.dtype, device) == "bfloat16"


def weight_dtype(spec: PoolSpec, trainable: bool) -> torch.dtype:
    """The dtype the weights are held in: float32 masters for trained weights under bf16
    (float16 trains in float16: float16 mixed precision would need loss scaling)."""
    if spec.dtype == "bfloat16" and trainable:
        return torch.float32
    return _DTYPES.get(spec.dtype, torch.float32)


def io_dtype(spec: PoolSpec) -> torch.dtype | None:
    """The dtype full weights are pushed and saved in when it differs from the masters'."""
    return torch.bfloat16 if spec.dtype == "bfloat16" else None


def checkpointing_on(spec: PoolSpec, device: str) -> bool:
    """Gradient checkpointing: the pool's setting, else on for cuda (activations dominate GPU
    memory at real sizes) and off on cpu (small models; the recompute would only cost time)."""
    if spec.gradient_checkpointing is not None:
        return spec.gradient_checkpointing
    return device.startswith("cuda")


def enable_checkpointing(model) -> None:
    """Non-reentrant checkpointing of each decoder layer: it needs no input that requires grad
    (a LoRA pool's frozen embeddings give none) and it recomputes inside FSDP's per-layer hooks,
    so it must be set before wrapping (PEFT or FSDP)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_full(model_path: str, dtype: torch.dtype):
    """The whole model from `model_path`, in this process's memory."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    except (OSError, ValueError) as err:  # ValueError: a folder transformers cannot read
        raise InvalidArgument(f"cannot load the pool's model from {model_path!r}: {err}") from None
    # padded batches on CPU: no copy of the keys per query head (atgrpo.attention)
    use_gqa_sdpa(model)
    return model


# The decoder layers' norms whose output only linear projections read (q, k, v; gate, up), in the
# architectures whose layers are known to be built so (the chunked head's, logprobs._PLAIN_HEAD).
_CAST_ONCE_NORMS = ("input_layernorm", "post_attention_layernorm")
_CAST_ONCE_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral"})


def cast_norms_once(model) -> list[torch.utils.hooks.RemovableHandle]:
    """Under autocast each projection casts its float32 input to bf16 itself, so a layer's norm
    output is cast three times (q, k, v) and again twice (gate, up), and the backward casts each
    of their input gradients back to float32 and adds them in float32. A hook on each such norm
    hands its projections the bf16 copy once: the forward's numbers are the same (the
    projections' own casts are then no-ops), the backward adds the projections' bf16 input
    gradients in bf16 before its one cast back (one more bf16 rounding of a sum of 3 or 2 terms).
    SmolLM2-135M, 30 layers: 6 of a layer's 10 activation casts each way, about 5% of a bf16
    update on a CPU. A no-op outside autocast (FSDP's own mixed precision, float32 pools) and for
    norms already in bf16 (a LoRA pool's bf16 base). Returns the hooks (bench/_update_speed.py
    removes them to time autocast's own casts)."""
    if getattr(getattr(model, "config", None), "model_type", None) not in _CAST_ONCE_TYPES:
        return []
    return [
        module.register_forward_hook(_to_autocast_dtype)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in _CAST_ONCE_NORMS
    ]


def _to_autocast_dtype(module, args, output):
    kind = output.device.type
    if output.dtype == torch.float32 and torch.is_autocast_enabled(kind):
        return output.to(torch.get_autocast_dtype(kind))
    return None


def load_sharded(
    model_path: str, dtype: torch.dtype, device: str, prepare: Callable, shard: Callable
):
    """Collective: the model as FSDP shards, where only rank 0 ever holds the full weights.

    Every rank builds the model with its parameters on the meta device (no memory), `prepare`s
    it (gradient checkpointing) and `shard`s it, then allocates its own shards; rank 0 loads the
    checkpoint and broadcasts it tensor by tensor, each rank keeping its shard. Buffers (rotary
    tables, not in the checkpoint) are built for real, they are small."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError) as err:  # ValueError: a folder transformers cannot read
        raise InvalidArgument(f"cannot load the pool's model from {model_path!r}: {err}") from None
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    use_gqa_sdpa(model)
    model.tie_weights()  # the empty-weights context made the tied head a parameter of its own
    prepare(model)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    shard(model, device)
    model.to_empty(device=device)  # also empties buffers: put them back
    with torch.no_grad():
        for name, b in buffers.items():
            model.get_buffer(name).copy_(b)
    full, error = {}, ""
    if dist.get_rank() == 0:
        try:
            full = load_full(model_path, dtype).state_dict()
        except InvalidArgument as err:  # told to every rank below, so none waits for weights
            error = str(err)
    broadcast_full_state(model, full, error)
    return model


def broadcast_full_state(model, full: dict[str, torch.Tensor], error: str = "") -> None:
    """Collective: rank 0 passes the whole state (or the `error` that kept it from reading it),
    the others {}; rank 0 broadcasts it tensor by tensor and each rank keeps its shard (measured
    with a 575 MB model on 2 ranks: rank 1 grew by 0.63 of it, against 1.12 when every rank
    loaded the model)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if (
        dist.get_rank() == 0
        and not error
        and (missing := sorted(set(model.state_dict()) - set(full)))
    ):
        error = (
            f"the checkpoint lacks {missing[:5]} (and {max(0, len(missing) - 5)} more) of the "
            f"model's "
            "tensors; give a checkpoint of this model"
        )
    problem = [error]
    # every rank refuses together: none waits for weights
    dist.broadcast_object_list(problem, src=0)
    if problem[0]:
        raise InvalidArgument(problem[0])
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )

"""How a pool's model is laid out over the ranks of one trainer (torchrun), and how full weights
and optimizer state are gathered from, and scattered back to, that layout.

Three layouts:
- ``none``: one process, the plain model (world size 1).
- ``ddp``: every rank holds the whole model; each takes its share of a mini-batch and the
  gradients are all-reduced (update.py). LoRA pools always run this way: their trainable state
  is tiny, and FSDP would have to wrap peft's per-agent adapter switching (set_adapter replaces
  which parameters require grad between micro-batches), which FSDP's parameter groups do not
  follow.
- ``fsdp``: full fine-tuning with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): each
  decoder layer, then the root, becomes one parameter group whose parameters, gradients and
  optimizer state are split over the ranks; forward/backward all-gather a layer's parameters
  and reduce-scatter its gradients. Works on CPU with gloo and on GPUs with NCCL.
- ``hsdp``: ``fsdp`` within each node, replicated across nodes (FSDP2 on a 2-D DeviceMesh
  (replicate, shard) = (nodes, ranks per node)): the per-layer all-gathers and reduce-scatters
  stay on a node's NVLink, and only one all-reduce of each rank's gradient shard crosses the
  network. ``auto`` picks it for a full fine-tuning pool past one node (mesh_shape).

Everything that gathers or scatters here is a collective: every rank must call it, in the same
order (trainer.py's PoolOps guarantees that). Full state lands on rank 0 only.
"""

from __future__ import annotations

import logging
import os
import types
import warnings

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

SHARDINGS = ("auto", "ddp", "fsdp", "hsdp")
SHARDED = ("fsdp", "hsdp")  # the layouts whose parameters are FSDP shards


def world() -> tuple[int, int]:
    """(rank, world size) under torch.distributed (torchrun), else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def ranks_per_node(world_size: int) -> int:
    """The ranks on this node: torchrun's LOCAL_WORLD_SIZE (every node runs --nproc-per-node)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))


def resolve(sharding: str, world_size: int, lora: bool, per_node: int | None = None) -> str:
    """The layout a pool actually gets: `auto` shards full fine-tuning over several ranks, within
    each node and replicated across nodes once the pool spans more than one (hsdp)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding {sharding!r}: use one of {SHARDINGS}")
    if world_size == 1:
        return "none"
    if lora:
        if sharding in SHARDED:
            log.info(
                "a LoRA pool runs replicated (ddp) over the ranks; fsdp applies to full fine-tuning"
            )
        return "ddp"
    if sharding == "ddp":
        return "ddp"
    per_node = ranks_per_node(world_size) if per_node is None else per_node
    if sharding == "hsdp":
        mesh_shape("hsdp", world_size, per_node)  # nodes of unequal sizes: refused, naming the fix
    if sharding == "auto":  # nodes of unequal sizes (no 2-D mesh) shard flat
        return "hsdp" if 0 < per_node < world_size and world_size % per_node == 0 else "fsdp"
    return sharding


def mesh_shape(layout: str, world_size: int, per_node: int) -> tuple[int, ...]:
    """FSDP's device mesh: (world,) for fsdp; (nodes, ranks per node) for hsdp, whose rows are
    nodes because torchrun numbers the ranks node after node. ValueError, naming the fix, when the
    nodes hold different numbers of ranks (no 2-D mesh covers them)."""
    if layout == "fsdp":
        return (world_size,)
    if per_node < 1 or world_size % per_node:
        raise ValueError(
            f"sharding hsdp over {world_size} ranks with {per_node} on this node: every node must "
            "run the same number of ranks (the same --nproc-per-node, the chart's "
            "trainerSvc.gpus); or set --sharding fsdp (ATGRPO_TRAINER_SHARDING) to shard flat "
            "across all ranks"
        )
    return (world_size // per_node, per_node)


def rank_device(device: str) -> str:
    """Each rank of a multi-GPU pool drives its own GPU (LOCAL_RANK), whatever Setup named;
    "auto" is cuda where there is one (the router does not know the trainer's hardware)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if world()[1] > 1 and device.startswith("cuda"):
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def shard(
    model: torch.nn.Module, device: str, mixed_bf16: bool = False, layout: str = "fsdp"
) -> torch.nn.Module:
    """FSDP2 in place: one group per decoder layer (so only one layer is ever unsharded at a
    time), then the root (final norm, head, and the embedding unless it has its own group; tied
    weights stay in one group). `layout`: fsdp shards over every rank, hsdp within each node
    (mesh_shape).

    `mixed_bf16`: FSDP2's own mixed precision (float32 shards, gathered in bf16, gradients
    reduced in float32) instead of autocast, whose cast cache kept a bf16 copy of every gathered
    layer until the backward (~14 GiB a rank at 8B): the gathered bf16 layer is the only copy.
    The output layer's group is gathered in float32 (its matmuls still run in bf16:
    HEAD_COMPUTE_DTYPE): the fused head adds its weight gradient into the gathered weight's .grad
    pass by pass (fused_head._FusedHeadLogprobs), and a bf16 .grad rounded that sum at every one of
    a micro-batch's ~34 passes (relative error 0.0056 against 0.0024 for one pass). That group
    is the root: the head must be gathered by the root's forward (sharded_forward). An untied
    embedding gets a bf16 group of its own, so that only the head and the final norm are float32
    (Qwen3-8B, while the root is unsharded: its head 1.2 GB more gathered, 1.2 GB more gradient,
    and a 1.2 GB bf16 copy for the matmuls); a tied one is the head, float32 with it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    size = dist.get_world_size()
    shape = mesh_shape(layout, size, ranks_per_node(size))
    names = ("replicate", "shard")[-len(shape) :]
    mesh = init_device_mesh(torch.device(device).type, shape, mesh_dim_names=names)
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_bf16
        else MixedPrecisionPolicy()
    )
    root_policy = MixedPrecisionPolicy(reduce_dtype=torch.float32) if mixed_bf16 else policy
    layers = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if mixed_bf16 and head is not None:
        if embedding is not None and embedding.weight is not head.weight:
            fully_shard(embedding, mesh=mesh, mp_policy=policy)
        setattr(head, HEAD_COMPUTE_DTYPE, torch.bfloat16)
    fully_shard(model, mesh=mesh, mp_policy=root_policy)
    # The chunked log-prob path calls the decoder and the head apart, not model.forward: run as
    # a forward of the root, FSDP gathers the root's parameters (final norm, head, a tied embedding)
    # for it and frees them after (logprobs.response_logprobs).
    setattr(model, FORWARD_METHOD, types.MethodType(_in_forward, model))
    register_fsdp_forward_method(model, FORWARD_METHOD)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # update.py weights each rank's loss by its share of the mini-batch's tokens, so the
            # gradients must be summed, not averaged (FSDP's default); a plain SUM also works on
            # gloo, which has no AVG or PREMUL_SUM.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


FORWARD_METHOD = "atgrpo_forward"
# The output layer's attribute naming the dtype its matmuls run in when the weight is held in
# another (shard: a float32 head under FSDP's bf16 mixed precision); logprobs.hidden_logprobs
# reads it.
HEAD_COMPUTE_DTYPE = "atgrpo_compute_dtype"


def _in_forward(model: torch.nn.Module, fn, *args):
    """fn(*args) as a forward of `model` (registered with FSDP in shard())."""
    return fn(*args)


def sharded_forward(model: torch.nn.Module, fn, *args):
    """fn(*args), as a forward of the root when the model is FSDP-sharded (its root's parameters
    gathered for it), else a plain call."""
    run = getattr(model, FORWARD_METHOD, None) if is_sharded(model) else None
    return run(fn, *args) if run is not None else fn(*args)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _full_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def host_state(model: torch.nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Collective when sharded: the whole model's tensors (HF names) on rank 0's CPU, floating ones
    in `dtype` (None: as held); {} on the other ranks. Tied weights stay one tensor.

    One tensor at a time: its shard is cast where it lives (the GPU in production), gathered in
    the cast dtype, copied to the host and dropped from the device, so rank 0's host holds the
    cast model (what a push or the model folder needs) and at most one gathered tensor more. Qwen3-
    8B pushed in bf16: 16.4 GB, where torch's get_model_state_dict gathered the float32 masters
    first (32.8 GB) and the cast came on top (16.4 GB more, ~22 s a push). Casting then gathering
    gives the bits of gathering then casting (the cast is per element), on half the bytes."""
    from torch.distributed.tensor import DTensor

    rank = world()[0]
    out: dict[str, torch.Tensor] = {}
    done: dict[int, torch.Tensor] = {}  # id of a parameter -> its host copy (tied names)
    with torch.no_grad():
        # keep_vars: the parameters themselves, so a tied weight is one object under two names
        for name, t in model.state_dict(keep_vars=True).items():
            if id(t) not in done:
                v = t.detach()
                if dtype is not None and v.is_floating_point():
                    v = v.to(dtype)  # on its device; a DTensor casts its local shard
                if isinstance(v, DTensor):
                    v = v.full_tensor()  # all-gather: every rank takes part
                done[id(t)] = v.cpu() if rank == 0 else v.new_empty(0)
                del v
            if rank == 0:
                out[name] = done[id(t)]
    return out


def load_full_model_state(model: torch.nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Collective: every rank passes the whole state; each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, full, options=_full_options())


def _names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state keyed by parameter name (collective when sharded; full on rank 0).

    One format whatever the layout, so a checkpoint of a sharded pool resumes in one process
    and the other way round (torch's own state_dict keys parameters by position)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    names = _names(model)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    plain = optimizer.state_dict()
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in plain["param_groups"]]
    return {"state": {order[i]: s for i, s in plain["state"].items()}, "param_groups": groups}


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Inverse of `optimizer_state` (collective when sharded; every rank passes the full state)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=_full_options())
        return
    names = _names(model)
    index = {
        names[id(p)]: i
        for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
    }
    # The saved groups carry the implementation the checkpoint was written with (fused, foreach);
    # this optimizer keeps its own, so an older checkpoint does not turn the fused step off.
    impl = {
        k: optimizer.param_groups[0][k]
        for k in ("fused", "foreach")
        if k in optimizer.param_groups[0]
    }
    groups = [
        {**g, "params": [index[n] for n in g["params"]], **impl} for g in state["param_groups"]
    ]
    optimizer.load_state_dict(
        {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}
    )


def save_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, where) -> None:
    """Collective: every rank writes its own shards of the weights (the float32 masters) and of
    AdamW's moments with torch.distributed.checkpoint. Nothing is gathered: gathered on rank 0,
    Qwen3-8B's masters and moments are ~98 GB of host memory, and every rank read all of it back
    on resume. The ranks must write to one shared folder (one node, or a shared volume)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, moments = get_state_dict(model, optimizer)
    dcp.save({"model": weights, "optimizer": moments}, checkpoint_id=str(where))


def load_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, where) -> None:
    """Inverse of `save_sharded_state` (collective when sharded): each rank reads only the parts
    of the files its shards cover. It reshards, so one process resumes from a sharded pool's
    checkpoint too (without a process group, it reads everything)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    weights, moments = get_state_dict(model, optimizer)
    state = {"model": weights, "optimizer": moments}
    # it warns that one process reads alone, which is the intent here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(
            state,
            checkpoint_id=str(where),
            no_dist=not (dist.is_available() and dist.is_initialized()),
        )
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )

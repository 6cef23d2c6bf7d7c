"""A pool's trainable state: the model (full, or a frozen base with one LoRA adapter per agent),
the optimizer and schedule, the version, and checkpoints that resume exactly.

On a pool over several ranks each rank holds one PoolState, built from the same spec and seed:
the whole model (ddp) or its FSDP shards (see sharding.py). Pushes and the checkpoint's model
folder gather the full weights onto rank 0. A sharded pool's masters and optimizer moments are
written shard by shard (torch.distributed.checkpoint), everything else's by parameter name, so
a sharded pool's checkpoint resumes in one process and the other way round."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pickle
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from atgrpo.contract.trainer import PoolSpec
from atgrpo.errors import FailedPrecondition, InvalidArgument
from trainer_svc.loading import (
    broadcast_full_state,
    cast_norms_once,
    checkpointing_on,
    compute_bf16,
    enable_checkpointing,
    io_dtype,
    load_full,
    load_sharded,
    resolve_dtype,
    weight_dtype,
)
from trainer_svc.sharding import (
    SHARDED,
    host_state,
    load_optimizer_state,
    load_sharded_state,
    optimizer_state,
    rank_device,
    resolve,
    save_sharded_state,
    shard,
    world,
)
from trainer_svc.update_context import DEFAULT_MICRO_BATCH_TOKENS, TrainerUpdateSettings

PEFT_STATE_PREFIX = "base_model.model."
TRAINER_STATE = "trainer_state.pt"  # schedule, RNGs; optimizer and masters unless sharded
SHARDED_STATE = "trainer_state.dcp"  # a sharded pool's masters and moments, one file per rank


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine down to `min_ratio` at `total` (the reference's
    schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def fused_adamw(sharded: bool) -> bool | None:
    """AdamW's fused kernel (one pass over each weight, its gradient and both moments) where the
    weights are plain tensors; None (torch's default: the per-weight loop on a CPU) for FSDP's
    DTensor shards. On a CPU the loop reads and writes every float32 tensor once per operation:
    SmolLM2-135M's step took 6.2 s against 2.6 s fused (two busy EPYC cores, one process), the
    same update up to float rounding."""
    return None if sharded else True


class PoolState:
    """One rank's part of the pool. On a pool over several ranks (torchrun) every rank builds
    one from the same spec and seed; `sharding` (see sharding.py) picks the layout."""

    def __init__(
        self,
        spec: PoolSpec,
        sharding: str = "auto",
        micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS,
    ):
        """`micro_batch_tokens`: the budget when the spec sets none (0)."""
        if spec.specialization not in ("full", "lora"):
            raise InvalidArgument(f"specialization {spec.specialization!r}: use 'full' or 'lora'")
        self.rank, world_size = world()
        self.layout = resolve(sharding, world_size, spec.specialization == "lora")
        self.device = rank_device(spec.device)
        self.spec = spec = dataclasses.replace(spec, dtype=resolve_dtype(spec.dtype, self.device))
        torch.manual_seed(spec.seed)
        # Master weights stay float32 under mixed precision; only the forward/backward run in bf16
        # (loading.py).
        self.mixed_bf16 = compute_bf16(spec, self.device)
        # sharded before the optimizer: it must hold the sharded parameters
        self.model = self._build()
        self.version = 0
        self.updates = 0
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=spec.lr,
            betas=spec.betas,
            weight_decay=spec.weight_decay,
            fused=fused_adamw(self.sharded),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, spec.warmup_steps, spec.total_steps, spec.min_lr_ratio),
        )
        self.generator = torch.Generator().manual_seed(spec.seed)
        # a full pool's frozen initial weights, loaded when the KL first needs them
        self._reference = None
        self.update_settings = TrainerUpdateSettings(
            micro_batch_tokens=spec.micro_batch_tokens or micro_batch_tokens,
            grad_clip=spec.grad_clip,
            autocast_bf16=self.autocast,
        )

    def _build(self):
        dtype = weight_dtype(self.spec, trainable=not self.lora)
        if self.sharded:  # full fine-tuning only (see resolve)
            return load_sharded(
                self.spec.model_path,
                dtype,
                self.device,
                self._prepare,
                lambda model, device: shard(
                    model, device, mixed_bf16=self.mixed_bf16, layout=self.layout
                ),
            )
        model = load_full(self.spec.model_path, dtype)
        self._prepare(model)
        if self.lora:
            model = self._with_adapters(model)
        return model.to(self.device)

    def _prepare(self, model) -> None:
        if checkpointing_on(self.spec, self.device):
            enable_checkpointing(model)
        # the norms' hooks (cast_norms_once), kept so a bench can time the update without them
        self.norm_hooks = cast_norms_once(model) if self.autocast else []

    @property
    def checkpointing(self) -> bool:
        """Whether the model recomputes its decoder layers' activations in the backward."""
        return bool(getattr(self.model, "is_gradient_checkpointing", False))

    @property
    def sharded(self) -> bool:
        return self.layout in SHARDED

    def _with_adapters(self, model):
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=self.spec.lora_rank,
            lora_alpha=self.spec.lora_alpha,
            lora_dropout=self.spec.lora_dropout,
            target_modules=list(self.spec.lora_targets),
        )
        model = get_peft_model(model, cfg, adapter_name=self.spec.agents[0])
        for agent in self.spec.agents[1:]:
            model.add_adapter(agent, cfg)
        for name, p in model.named_parameters():  # every adapter trains; the base never does
            p.requires_grad = "lora_" in name
        return model

    @property
    def autocast(self) -> bool:
        """Whether the update runs under bf16 autocast: mixed precision, unless FSDP does it
        (sharding.shard's MixedPrecisionPolicy)."""
        return self.mixed_bf16 and not self.sharded

    @contextlib.contextmanager
    def reference(self):
        """The frozen reference the KL term scores with: a LoRA pool's base with every adapter
        off (no second copy), a full pool's initial weights (model_path; loaded on first use, so a
        run with kl_coef 0 holds nothing extra; in bf16 under mixed precision, where the forward
        runs in bf16 anyway). Every rank calls it in step, so a sharded pool shards it alike."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
            return
        if self._reference is None:
            dtype = torch.bfloat16 if self.mixed_bf16 else weight_dtype(self.spec, trainable=False)
            if self.sharded:
                ref = load_sharded(
                    self.spec.model_path,
                    dtype,
                    self.device,
                    lambda _: None,
                    lambda model, device: shard(model, device, layout=self.layout),
                )
            else:
                ref = load_full(self.spec.model_path, dtype).to(self.device)
            self._reference = ref.requires_grad_(False).eval()
        yield self._reference

    @property
    def lora(self) -> bool:
        return self.spec.specialization == "lora"

    def activate(self, agent: str):
        """Make `agent`'s adapter the active one (LoRA pools); returns a no-op context."""
        self.model.base_model.set_adapter(agent)
        for name, p in self.model.named_parameters():
            # set_adapter freezes inactive adapters; keep all trainable
            p.requires_grad = "lora_" in name
        return contextlib.nullcontext()

    # --- what gets pushed to rollout replicas ------------------------------------------------

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model in the pushed dtype, on rank 0's CPU (collective when sharded; {} on the
        other ranks), cast tensor by tensor on its device (sharding.host_state). A tied head is
        left out: it is the embedding under a second name, which the replicas tie back (the
        engines' load_full), and pushing it would send Qwen3-1.7B's embedding twice (0.6 GB more
        in bf16)."""
        state = host_state(self.model, io_dtype(self.spec))
        if getattr(self.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        return state

    def adapter_state(self, agent: str) -> tuple[dict[str, torch.Tensor], dict]:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model, adapter_name=agent)
        config = json.loads(json.dumps(self.model.peft_config[agent].to_dict(), default=list))
        return {k: v.detach() for k, v in state.items()}, config

    # --- checkpoints -------------------------------------------------------------------------

    def checkpoint_bytes(self) -> int:
        """About what save() writes: model/ (a full pool's weights in the saved dtype, a LoRA pool's
        adapters) and trainer_state.pt (the float32 masters when saved in another dtype, AdamW's
        two moments of every trained parameter). numel() of an FSDP parameter is the whole one's."""
        trained = sum(p.numel() * p.element_size() for p in self.params)
        moments = 2 * trained
        if self.lora:
            return trained + moments
        out = io_dtype(self.spec)
        weights = sum(
            p.numel() * (out.itemsize if out is not None else p.element_size())
            for p in self.model.parameters()
        )
        masters = (
            sum(p.numel() * p.element_size() for p in self.model.parameters())
            if out is not None
            else 0
        )
        return weights + masters + moments

    def save(self, where: str | Path) -> Path:
        """Model or adapters in HF / PEFT format (from_pretrained loads them), plus everything an
        exact resume needs: optimizer, schedule, RNG states and version. Every rank calls it (a
        sharded pool gathers its state); rank 0 writes."""
        where = Path(where)
        # Under mixed precision the model folder keeps the pool's dtype (what eval and rollout
        # load, the size it had) and the float32 masters go with the optimizer, for an exact resume;
        # the cast is made tensor by tensor on the device (host_state), never from a float32 copy.
        master, out = None, io_dtype(self.spec)
        model_state = host_state(self.model, out) if self.sharded else None
        if self.sharded:
            save_sharded_state(self.model, self.optimizer, where / SHARDED_STATE)
        optimizer = None if self.sharded else optimizer_state(self.model, self.optimizer)
        if self.rank != 0:
            return where
        where.mkdir(parents=True, exist_ok=True)
        if out is not None and not self.lora and not self.sharded:
            master = self.model.state_dict()  # the live masters: no copy
            model_state = host_state(self.model, out)
        if model_state is None:
            self.model.save_pretrained(where / "model")
        else:  # the gathered (or cast) tensors: the live ones are shards or masters
            self.model.save_pretrained(where / "model", state_dict=model_state)
        if out is not None and not self.lora:
            _set_saved_dtype(where / "model", out)
        torch.save(
            {
                **({"optimizer": optimizer} if optimizer is not None else {}),
                **(
                    {"master": {k: v.detach() for k, v in master.items()}}
                    if master is not None
                    else {}
                ),
                "scheduler": self.scheduler.state_dict(),
                "generator": self.generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "numpy_rng": _numpy_rng_plain(),
                "python_rng": random.getstate(),
            },
            where / TRAINER_STATE,
        )
        (where / "atgrpo.json").write_text(
            json.dumps(
                {"version": self.version, "updates": self.updates, "spec": asdict(self.spec)},
                indent=2,
            )
        )
        return where

    def _load_weights(self, where: Path, master: dict | None) -> None:
        """The float32 masters when the checkpoint has them, else its model folder; on a sharded
        pool rank 0 reads them and broadcasts, so no other rank holds a full copy."""
        full, error = {}, ""
        if self.rank == 0:
            try:
                full = (
                    master
                    if master is not None
                    else load_full(str(where / "model"), weight_dtype(self.spec, True)).state_dict()
                )
            except InvalidArgument as err:
                if not self.sharded:
                    raise
                error = str(err)  # every rank raises it (broadcast_full_state)
        if self.sharded:
            broadcast_full_state(self.model, full, error)
        else:
            self.model.load_state_dict(full)

    def load(self, where: str | Path) -> None:
        where = Path(where)
        meta = json.loads((where / "atgrpo.json").read_text())
        if (
            meta["spec"]["pool"] != self.spec.pool
            or meta["spec"]["specialization"] != self.spec.specialization
        ):
            raise FailedPrecondition(
                f"checkpoint {where} is of pool {meta['spec']['pool']!r} "
                f"({meta['spec']['specialization']}), not this one"
            )
        if self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            for agent in self.spec.agents:  # PEFT saves each named adapter in a folder of its name
                sub = where / "model" / agent
                set_peft_model_state_dict(
                    self.model,
                    load_file(str(sub / "adapter_model.safetensors")),
                    adapter_name=agent,
                )
        state = read_trainer_state(where / TRAINER_STATE)
        if (where / SHARDED_STATE).is_dir():  # a sharded pool's: masters and moments by shard
            load_sharded_state(self.model, self.optimizer, where / SHARDED_STATE)
        else:
            if not self.lora:
                self._load_weights(where, state.get("master"))
            load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        name, keys, pos, has_gauss, gauss = state["numpy_rng"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        random.setstate(state["python_rng"])
        self.version, self.updates = meta["version"], meta["updates"]


def read_trainer_state(path: Path) -> dict:
    """A checkpoint's trainer_state.pt, tensors on the CPU and memory-mapped from the file.

    On the CPU: a checkpoint written on a GPU loads on any machine, and on every rank (each puts
    what it needs on its own device). Mapped: pages are read as the tensors are copied into the
    pool, and ranks of one node share them, rather than each rank reading the whole file into its
    memory. weights_only: tensors and plain containers only, so a checkpoint cannot run code."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as err:
        raise InvalidArgument(
            f"{path} holds more than tensors and plain values, which could run code on "
            f"load; resume from a checkpoint atgrpo wrote ({err})"
        ) from None


def delete_checkpoint(where: str | Path, spec: PoolSpec) -> bool:
    """Delete a folder save() wrote for this pool and run; False when it is already gone. Anything
    else is refused: the path comes over the network, and only checkpoints are ours to delete.
    The emptied step-N folder above it (the router's layout) goes too."""
    where = Path(where)
    if not where.exists():
        return False
    meta_path = where / "atgrpo.json"
    try:
        meta = json.loads(meta_path.read_text())["spec"]
        ours = (
            where.is_dir()
            and not where.is_symlink()
            and (meta["pool"], meta["run_id"]) == (spec.pool, spec.run_id)
        )
    except (OSError, ValueError, KeyError, TypeError):
        ours = False
    if not ours:
        raise FailedPrecondition(
            f"{where} is not a checkpoint of run {spec.run_id!r}, pool {spec.pool!r} (no "
            "atgrpo.json of theirs in it): only such folders are deleted"
        )
    shutil.rmtree(where)
    if where.parent.name.startswith("step-"):
        with contextlib.suppress(OSError):  # not empty: another pool's checkpoint of that step
            where.parent.rmdir()
    return True


def _set_saved_dtype(model_dir: Path, dtype: torch.dtype) -> None:
    """save_pretrained records the live (master) dtype in config.json; record the saved one, so
    that from_pretrained(dtype="auto") loads the model as it was written."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _numpy_rng_plain() -> tuple:
    """numpy's global RNG state without numpy types, which torch.load(weights_only=True) refuses."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return name, keys.tolist(), int(pos), int(has_gauss), float(gauss)

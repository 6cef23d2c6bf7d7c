"""A pool's trainable state: the model (full, or a frozen base with one LoRA adapter per agent),
the optimizer and schedule, the version, and checkpoints that resume exactly.

On a pool over several ranks each rank holds one PoolState, built from the same spec and seed:
the whole model (ddp) or its FSDP shards (see sharding.py). Pushes and checkpoints gather the
full state onto rank 0; checkpoints keep the optimizer state by parameter name, so a sharded
pool's checkpoint resumes in one process and the other way round."""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from atgrpo.contract.trainer import PoolSpec
from atgrpo.errors import FailedPrecondition, InvalidArgument
from trainer_svc.sharding import (
    full_model_state,
    load_full_model_state,
    load_optimizer_state,
    optimizer_state,
    rank_device,
    resolve,
    shard,
    world,
)

PEFT_STATE_PREFIX = "base_model.model."


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine down to `min_ratio` at `total` (the reference's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class PoolState:
    """One rank's part of the pool. On a pool over several ranks (torchrun) every rank builds
    one from the same spec and seed; `sharding` (see sharding.py) picks the layout."""

    def __init__(self, spec: PoolSpec, sharding: str = "auto"):
        if spec.specialization not in ("full", "lora"):
            raise InvalidArgument(f"specialization {spec.specialization!r}: use 'full' or 'lora'")
        self.spec = spec
        self.rank, world_size = world()
        self.layout = resolve(sharding, world_size, spec.specialization == "lora")
        self.device = rank_device(spec.device)
        torch.manual_seed(spec.seed)
        # Master weights stay float32 under mixed precision; only the forward/backward run in bf16.
        self.mixed_bf16 = (spec.dtype == "auto" and self.device.startswith("cuda") and torch.cuda.is_available()
                           and torch.cuda.is_bf16_supported())
        model = self._load_model()
        if spec.specialization == "lora":
            model = self._with_adapters(model)
        self.model = model.to(self.device)
        if self.sharded:
            shard(self.model, self.device)   # before the optimizer: it must hold the sharded parameters
        self.version = 0
        self.updates = 0
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, spec.warmup_steps, spec.total_steps, spec.min_lr_ratio))
        self.generator = torch.Generator().manual_seed(spec.seed)
        self._reference = None   # a full pool's frozen initial weights, loaded when the KL first needs them

    def _load_model(self):
        from transformers import AutoModelForCausalLM

        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.spec.dtype, torch.float32)
        try:
            return AutoModelForCausalLM.from_pretrained(self.spec.model_path, dtype=dtype)
        except OSError as err:
            raise InvalidArgument(f"cannot load the pool's model from {self.spec.model_path!r}: {err}") from None

    @property
    def sharded(self) -> bool:
        return self.layout == "fsdp"

    def _with_adapters(self, model):
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=self.spec.lora_rank, lora_alpha=self.spec.lora_alpha, lora_dropout=self.spec.lora_dropout,
                         target_modules=list(self.spec.lora_targets))
        model = get_peft_model(model, cfg, adapter_name=self.spec.agents[0])
        for agent in self.spec.agents[1:]:
            model.add_adapter(agent, cfg)
        for name, p in model.named_parameters():   # every adapter trains; the base never does
            p.requires_grad = "lora_" in name
        return model

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
            ref = self._load_model()
            if self.mixed_bf16:
                ref = ref.to(torch.bfloat16)
            ref = ref.requires_grad_(False).eval().to(self.device)
            self._reference = shard(ref, self.device) if self.sharded else ref
        yield self._reference

    @property
    def lora(self) -> bool:
        return self.spec.specialization == "lora"

    def activate(self, agent: str):
        """Make `agent`'s adapter the active one (LoRA pools); returns a no-op context."""
        self.model.base_model.set_adapter(agent)
        for name, p in self.model.named_parameters():
            p.requires_grad = "lora_" in name   # set_adapter freezes inactive adapters; keep all trainable
        return contextlib.nullcontext()

    # --- what gets pushed to rollout replicas ------------------------------------------------

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model (collective when sharded: full on rank 0 only)."""
        if self.sharded:
            return full_model_state(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def adapter_state(self, agent: str) -> tuple[dict[str, torch.Tensor], dict]:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model, adapter_name=agent)
        config = json.loads(json.dumps(self.model.peft_config[agent].to_dict(), default=list))
        return {k: v.detach() for k, v in state.items()}, config

    # --- checkpoints -------------------------------------------------------------------------

    def save(self, where: str | Path) -> Path:
        """Model or adapters in HF / PEFT format (from_pretrained loads them), plus everything an
        exact resume needs: optimizer, schedule, RNG states and version. Every rank calls it (a
        sharded pool gathers its state); rank 0 writes."""
        where = Path(where)
        model_state = full_model_state(self.model) if self.sharded else None
        optimizer = optimizer_state(self.model, self.optimizer)
        if self.rank != 0:
            return where
        where.mkdir(parents=True, exist_ok=True)
        if model_state is None:
            self.model.save_pretrained(where / "model")
        else:   # the gathered tensors: the live ones are shards
            self.model.save_pretrained(where / "model", state_dict=model_state)
        torch.save({"optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                    "generator": self.generator.get_state(), "torch_rng": torch.get_rng_state(),
                    "numpy_rng": _numpy_rng_plain(), "python_rng": random.getstate()},
                   where / "trainer_state.pt")
        (where / "atgrpo.json").write_text(json.dumps({"version": self.version, "updates": self.updates,
                                                       "spec": asdict(self.spec)}, indent=2))
        return where

    def load(self, where: str | Path) -> None:
        where = Path(where)
        meta = json.loads((where / "atgrpo.json").read_text())
        if meta["spec"]["pool"] != self.spec.pool or meta["spec"]["specialization"] != self.spec.specialization:
            raise FailedPrecondition(f"checkpoint {where} is of pool {meta['spec']['pool']!r} "
                                     f"({meta['spec']['specialization']}), not this one")
        if self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            for agent in self.spec.agents:   # PEFT saves each named adapter in a folder of its name
                sub = where / "model" / agent
                set_peft_model_state_dict(self.model, load_file(str(sub / "adapter_model.safetensors")), adapter_name=agent)
        else:
            from transformers import AutoModelForCausalLM

            full = AutoModelForCausalLM.from_pretrained(where / "model").state_dict()
            if self.sharded:
                load_full_model_state(self.model, full)
            else:
                self.model.load_state_dict(full)
        # weights_only: tensors and plain containers only, so a checkpoint cannot run code on load.
        try:
            state = torch.load(where / "trainer_state.pt", weights_only=True)
        except pickle.UnpicklingError as err:
            raise InvalidArgument(f"{where / 'trainer_state.pt'} holds more than tensors and plain values, which "
                                  f"could run code on load; resume from a checkpoint atgrpo wrote ({err})") from None
        load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        name, keys, pos, has_gauss, gauss = state["numpy_rng"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        random.setstate(state["python_rng"])
        self.version, self.updates = meta["version"], meta["updates"]


def _numpy_rng_plain() -> tuple:
    """numpy's global RNG state without numpy types, which torch.load(weights_only=True) refuses."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return name, keys.tolist(), int(pos), int(has_gauss), float(gauss)

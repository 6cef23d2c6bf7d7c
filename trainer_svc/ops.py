"""The operations on a pool's model, free of gRPC: set up, train, release memory, weights to push,
save. Every rank of a pool runs them in the same order (trainer.py drives them on rank 0,
distributed.py replays them on the others). Nothing here imports grpc, so the trainer's part of
scripts/gpu_check.py runs on a GPU machine that has only torch and transformers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from atgrpo.contract.trainer import PoolSpec, TrainSample, UpdateConfig
from atgrpo.model_thread import peak_rss_bytes, release_freed_memory, rss_bytes
from atgrpo.perf import UPDATE_CPU_SHAPE, matmul_rate
from trainer_svc.state import PoolState
from trainer_svc.update import update
from trainer_svc.update_context import DEFAULT_MICRO_BATCH_TOKENS


class PoolOps:
    """The pool operations every rank runs, in the same order: on a pool over several ranks
    (torchrun) rank 0's Trainer drives them and the other ranks replay each one it sends them
    (distributed.py), because FSDP's gathers and gradient reductions are collectives. Requests
    are validated on rank 0 before they are sent, so every rank sees only good input."""

    def __init__(
        self, sharding: str = "auto", micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS
    ):
        self.sharding = sharding
        self.micro_batch_tokens = micro_batch_tokens  # the budget when a pool's spec sets none
        self.state: PoolState | None = None
        # FLOP/s of this process's matmuls on the pool's device (atgrpo.perf)
        self.matmul_rate = 0.0

    def setup(self, spec: PoolSpec, resume_from: str = "") -> PoolState:
        state = PoolState(spec, self.sharding, self.micro_batch_tokens)
        if resume_from:
            state.load(resume_from)
        # Measured once per device and dtype (cached), here rather than in the first update: what
        # an update's FLOP/s are held against (update_mfu), in the dtype its matmuls run in, at a
        # shape the matrix units run at their best (on a CPU a 1024^3 square: UPDATE_CPU_SHAPE).
        compute = torch.bfloat16 if state.mixed_bf16 else next(state.model.parameters()).dtype
        cpu = torch.device(state.device).type == "cpu"
        self.matmul_rate = matmul_rate(
            str(state.device), compute, shape=UPDATE_CPU_SHAPE if cpu else None
        )
        self.state = state
        return state

    def train(self, samples: Sequence[TrainSample], cfg: UpdateConfig) -> dict[str, float]:
        state = self.state
        metrics = update(
            state.model,
            state.optimizer,
            samples,
            cfg,
            params=state.params,
            settings=state.update_settings,
            device=state.device,
            adapter=state.activate if state.lora else None,
            generator=state.generator,
            reference=state.reference,
        )
        state.scheduler.step()
        state.version += 1
        state.updates += 1
        return metrics

    def release(self) -> dict[str, float]:
        """Hand the update's freed activations back to the system: the rollout generates the next
        step while the trainer waits, and on a shared machine it needs that memory. Returns the
        resident memory before and after, and the process's peak, for the step's metrics."""
        held = rss_bytes()
        release_freed_memory()
        return {
            "rss_gb": held / 1e9,
            "rss_released_gb": (held - rss_bytes()) / 1e9,
            "rss_peak_gb": peak_rss_bytes() / 1e9,
        }

    def weights(self, agents: Sequence[str]) -> list[tuple[str, dict, dict | None]]:
        """What to push: each named agent's adapter (LoRA), or the full model ("" adapter)."""
        state = self.state
        if state.lora:
            return [(a, *state.adapter_state(a)) for a in agents]
        return [("", state.full_state(), None)]

    def save(self, where: str) -> Path:
        """Write a checkpoint, then hand its serialisation buffers back (as `release` does an
        update's): a checkpoint comes after the step's release and would hold them until the
        next."""
        path = self.state.save(where)
        release_freed_memory()
        return path

"""The trainer's logic: set up a pool for a run, train on a step's samples, push the new weights
to every rollout replica of the pool, checkpoint. Free of gRPC but for the rollout client."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atgrpo.errors import FailedPrecondition, InvalidArgument
from rollout_svc.client import RolloutClient
from trainer_svc.state import PoolSpec, PoolState
from trainer_svc.update import TrainSample, UpdateConfig, update, validate


@dataclass
class TrainResult:
    run_id: str
    step: int
    version: int
    metrics: dict[str, float]
    agents: dict[str, dict[str, float]] = field(default_factory=dict)
    replayed: bool = False


class Trainer:
    def __init__(self, pool_name: str = ""):
        self.pool_name = pool_name
        self.state: PoolState | None = None
        self._done: dict[tuple[str, int], TrainResult] = {}   # (run, step) -> result: Train is idempotent
        self._lock = asyncio.Lock()

    async def setup(self, spec: PoolSpec, resume_from: str = "") -> PoolState:
        async with self._lock:
            if self.state is not None:
                if self.state.spec.run_id == spec.run_id and self.state.spec.pool == spec.pool:
                    return self.state          # a repeated Setup of the same run is a no-op
                raise FailedPrecondition(f"this trainer serves run {self.state.spec.run_id!r}, pool "
                                         f"{self.state.spec.pool!r}; start another trainer for {spec.run_id!r}")
            if self.pool_name and spec.pool != self.pool_name:
                raise InvalidArgument(f"this trainer was started for pool {self.pool_name!r}, not {spec.pool!r}")
            state = await asyncio.to_thread(PoolState, spec)
            if resume_from:
                await asyncio.to_thread(state.load, resume_from)
            # Replicas must serve what this trainer holds before the first Collect: every adapter
            # (a replica has none until pushed), or the resumed model (a replica starts at v0).
            if state.lora:
                await self._push(state, state.spec.agents)
            elif state.version > 0:
                await self._push(state, [])
            self.state = state
            return state

    def need_state(self) -> PoolState:
        if self.state is None:
            raise FailedPrecondition("the trainer has no pool yet; call Setup first")
        return self.state

    async def train(self, run_id: str, step: int, expected_version: int, samples: Sequence[TrainSample],
                    cfg: UpdateConfig) -> TrainResult:
        async with self._lock:
            state = self.need_state()
            if (run_id, step) in self._done:
                done = self._done[(run_id, step)]
                return TrainResult(done.run_id, done.step, done.version, done.metrics, done.agents, replayed=True)
            if run_id != state.spec.run_id:
                raise FailedPrecondition(f"samples of run {run_id!r}; this trainer serves {state.spec.run_id!r}")
            if expected_version != state.version:
                raise FailedPrecondition(f"the samples were drawn from version {expected_version}, the pool is at "
                                         f"{state.version}: recollect with the current weights (on-policy)")
            validate(samples, state.spec.agents, cfg.micro_batch_tokens)
            cfg = dataclasses.replace(cfg, autocast_bf16=state.mixed_bf16)
            start = time.perf_counter()
            metrics = await asyncio.to_thread(
                update, state.model, state.optimizer, samples, cfg, params=state.params, device=state.spec.device,
                adapter=state.activate if state.lora else None, generator=state.generator)
            state.scheduler.step()
            state.version += 1
            state.updates += 1
            metrics["train_seconds"] = time.perf_counter() - start
            metrics["tokens"] = float(sum(len(s.response_ids) for s in samples))
            metrics["samples"] = float(len(samples))
            trained = sorted({s.agent for s in samples})
            push_s, push_bytes = await self._push(state, trained)
            metrics.update(push_seconds=push_s, push_bytes=float(push_bytes))
            agents = {a: {"samples": float(sum(s.agent == a for s in samples)),
                          "tokens": float(sum(len(s.response_ids) for s in samples if s.agent == a))} for a in trained}
            result = TrainResult(run_id, step, state.version, metrics, agents)
            self._done[(run_id, step)] = result
            every = state.spec.checkpoint_every_updates
            if every and state.spec.checkpoint_dir and state.updates % every == 0:
                await asyncio.to_thread(state.save, self._default_dir(state))
            return result

    @staticmethod
    def _default_dir(state: PoolState) -> str:
        return str(Path(state.spec.checkpoint_dir) / f"version-{state.version}")

    async def _push(self, state: PoolState, agents: Sequence[str]) -> tuple[float, int]:
        """New weights to every replica at once; answers once all acknowledged (on-policy)."""
        if not state.spec.rollout_addresses:
            return 0.0, 0
        payloads = ([(a, *state.adapter_state(a)) for a in agents] if state.lora
                    else [("", state.full_state(), None)])
        start = time.perf_counter()

        async def one(address: str) -> int:
            sent = 0
            async with RolloutClient(address) as client:
                for adapter, tensors, config in payloads:
                    resp = await client.load_weights(tensors, state.spec.pool, state.version, adapter=adapter,
                                                     adapter_config=config)
                    sent += resp.bytes_received
            return sent

        sent = await asyncio.gather(*(one(a) for a in state.spec.rollout_addresses))
        return time.perf_counter() - start, sum(sent)

    async def save_checkpoint(self, where: str = "") -> tuple[Path, int]:
        async with self._lock:
            state = self.need_state()
            if not where:
                if not state.spec.checkpoint_dir:
                    raise InvalidArgument("no checkpoint directory: pass dir, or set checkpoint_dir in Setup")
                where = self._default_dir(state)
            path = await asyncio.to_thread(state.save, where)
            return path, state.version

"""The trainer's logic: set up a pool for a run, train on a step's samples, push the new weights
to every rollout replica of the pool, checkpoint. Free of gRPC but for the rollout client.

Trainer is what the servicer calls: request checks, versions, idempotent replay, pushes. The
work on the model goes through PoolOps, so that on a pool over several ranks (torchrun) the
other ranks run each operation with rank 0 (distributed.py); in one process it is a plain call."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from atgrpo.contract.trainer import PoolSpec, TrainResult, TrainSample, UpdateConfig
from atgrpo.errors import (
    AtgrpoError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
)
from atgrpo.model_thread import ModelThread
from rollout_svc.client import PROBE_S, RolloutClient, push_weights_each
from trainer_svc import metrics as telemetry  # `metrics` is a TrainResult's dict below
from trainer_svc.distributed import Ranks, bind_device
from trainer_svc.ops import PoolOps
from trainer_svc.state import PoolState, delete_checkpoint
from trainer_svc.update import validate
from trainer_svc.update_context import DEFAULT_MICRO_BATCH_TOKENS


def staleness_max(samples: Sequence[TrainSample], allowed: int, max_staleness: int = 0) -> int:
    """How many versions the oldest pinned sample lags `allowed`, the version the pool holds.
    Samples may lag it by up to `max_staleness` versions (asynchronous training); a sample of any
    other version is refused whole, before anything trains. A synchronous run (0) trains
    on-policy only: a sample of another version (a rollout replica that restarted and served its
    initial weights, say) is refused. A sample newer than the pool's weights is refused always:
    no replica can serve weights the trainer has not made yet."""
    for i, s in enumerate(samples):
        v = s.policy_version
        if v is None or allowed - max_staleness <= v <= allowed:
            continue
        where = f"sample {i} (agent {s.agent!r}) was drawn from version {v}"
        if max_staleness == 0:
            raise FailedPrecondition(
                f"{where}, but this run trains only on version {allowed}, the weights the pool "
                f"holds: nothing was trained; collect the step again from replicas that serve "
                f"version {allowed} (the router resyncs them)"
            )
        if v > allowed:
            raise FailedPrecondition(
                f"{where}, newer than version {allowed}, the weights the pool holds: nothing was "
                f"trained; a replica "
                "serves weights this trainer did not make (another run's, or a trainer restored "
                "from an older checkpoint): resync the replicas (the router's Setup does) and "
                "collect the step again"
            )
        raise FailedPrecondition(
            f"{where}, {allowed - v} versions behind version {allowed}, the weights the pool "
            f"holds, but this pool trains on samples at most {max_staleness} behind "
            f"(max_staleness): nothing was trained; drop the samples older than version "
            f"{allowed - max_staleness} and send the rest, or raise max_staleness"
        )
    pinned = [s.policy_version for s in samples if s.policy_version is not None]
    return allowed - min(pinned) if pinned else 0


def sample_staleness(samples: Sequence[TrainSample], allowed: int) -> list[int]:
    """How many versions each sample lags `allowed` (an unpinned sample: 0, taken as current)."""
    return [0 if s.policy_version is None else allowed - s.policy_version for s in samples]


REPLAYED = 8

log = logging.getLogger("atgrpo.trainer")


class Trainer:
    def __init__(
        self,
        pool_name: str = "",
        sharding: str = "auto",
        ranks: Ranks | None = None,
        micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS,
    ):
        """`micro_batch_tokens`: the budget of a pool whose Setup sets none."""
        self.pool_name = pool_name
        self.ops = PoolOps(sharding, micro_batch_tokens)
        self.ranks = ranks  # set on rank 0 of a torchrun pool: the other ranks follow
        # (run, step) -> result, the last REPLAYED steps': Train is idempotent. A retry is of the
        # step in flight; an older step's samples are refused by their version anyway.
        self._done: dict[tuple[str, int], TrainResult] = {}
        self._pushed: dict[str, int] = {}  # adapter ("" = the model) -> the version last pushed
        self._lock = asyncio.Lock()
        # Every operation on the model runs on this one thread: on rotating threads each update's
        # freed activations pile up in another malloc arena until the OOM kill (model_thread.py).
        # On a GPU rank it works on that rank's device (CUDA's current device is per thread).
        self._thread = ModelThread("pool-ops", initializer=bind_device)

    @property
    def state(self) -> PoolState | None:
        return self.ops.state

    def _collective(self, op: str, *args):
        if self.ranks is not None:  # with the other ranks; a failure there ends this process
            return self.ranks.lead(self.ops, op, args)
        return getattr(self.ops, op)(*args)

    async def _run(self, op: str, *args):
        """Run a PoolOps operation here and on every other rank (off the event loop)."""
        return await self._thread.run(self._collective, op, *args)

    async def setup(
        self,
        spec: PoolSpec,
        resume_from: str = "",
        reload: bool = False,
        *,
        replicas_only: bool = False,
    ) -> PoolState:
        # A repeat asks each replica what it serves before taking the lock: one that does not
        # answer (restarting, gone) costs up to PROBE_S, which no update should wait behind.
        repeat = self.state is not None and not reload and self.state.spec.pool == spec.pool
        probed = await self._probe(spec.rollout_addresses, spec.pool) if repeat else None
        async with self._lock:
            held = self.state.spec if self.state is not None else None
            if replicas_only and (
                held is None or (held.run_id, held.pool) != (spec.run_id, spec.pool) or reload
            ):
                raise FailedPrecondition(
                    f"this trainer holds no weights of run {spec.run_id!r}, pool {spec.pool!r} "
                    "(it restarted?), so it takes no replicas: set it up with Setup (the "
                    "router's recovery does, from the last checkpoint)"
                )
            if self.state is not None:
                same = self.state.spec.run_id == spec.run_id and self.state.spec.pool == spec.pool
                if not same:
                    held = self.state.spec
                    raise FailedPrecondition(
                        f"this trainer serves run {held.run_id!r}, pool {held.pool!r}, and holds "
                        f"that run's weights, so it cannot take run {spec.run_id!r}, pool "
                        f"{spec.pool!r}. Locally: "
                        "`atgrpo down` then `atgrpo up CONFIG` for fresh services (or leave "
                        "services: out of the config and `atgrpo train` starts its own); on "
                        "Kubernetes: restart the trainer pod "
                        f"(`kubectl rollout restart "
                        f"statefulset/<release>-atgrpo-trainer-{held.pool}`; "
                        "`helm upgrade` with the new config does it) or install the run in its own "
                        "release"
                    )
                if not reload:
                    # A repeat: the router's list of the pool's replicas now (some joined, some
                    # left); bring each up to date, a joining or restarted one included.
                    self._set_replicas(self.state, spec.rollout_addresses)
                    await self._sync_replicas(self.state, probed)
                    return self.state
            if self.pool_name and spec.pool != self.pool_name:
                raise InvalidArgument(
                    f"this trainer was started for pool {self.pool_name!r}, not {spec.pool!r}"
                )
            previous = self.ops.state
            state = await self._run("setup", spec, resume_from)
            self._done.clear()  # results of steps after the checkpoint no longer hold
            # Replicas must serve what this trainer holds before the first Collect: every adapter
            # (a replica has none until pushed), or the resumed model (a replica starts at v0). A
            # restored trainer's weights replace newer ones a replica may still serve: a checkpoint
            # of version 0 too, when the replicas kept running at a later version of the run.
            try:
                if state.lora:
                    await self._push(state, state.spec.agents, rollback=True)
                elif state.version > 0 or previous is not None or resume_from:
                    await self._push(state, [], rollback=True)
                else:  # a restarted trainer back at the start: replicas may serve a later version
                    await self._sync_replicas(state)
            except BaseException:
                self.ops.state = None  # not set up until the replicas are: Setup may be retried
                raise
            telemetry.set_version(spec.run_id, spec.pool, state.version)
            return state

    @staticmethod
    def _set_replicas(state: PoolState, addresses: Sequence[str]) -> None:
        state.spec = dataclasses.replace(state.spec, rollout_addresses=tuple(addresses))

    def _drop_replicas(self, state: PoolState, lost: Sequence[str]) -> None:
        """Replicas that are gone (or died mid-push) leave the list: they hold no current weights,
        so the router must not collect on them until a Setup lists them again and syncs them.
        The update itself stands: its weights reach every replica that remains."""
        # counted at 0 too: the series exists (and a dashboard shows 0) before any loss
        telemetry.replicas_lost(state.spec.run_id, state.spec.pool, len(lost))
        if lost:
            log.warning("pool %s: rollout replicas %s lost; left out", state.spec.pool, lost)
            self._set_replicas(
                state, [a for a in state.spec.rollout_addresses if a not in set(lost)]
            )

    @staticmethod
    async def _probe(addresses: Sequence[str], pool: str) -> dict[str, dict[str, int] | None]:
        """address -> what it serves of `pool` (adapter -> version), None when it does not answer
        within PROBE_S or answers nonsense: one replica must not stop the run."""

        async def one(address: str) -> dict[str, int] | None:
            try:
                async with RolloutClient(address) as client:
                    policies = await client.policies(timeout_s=PROBE_S)
            except (Unavailable, DeadlineExceeded):
                return None
            except AtgrpoError as err:
                log.error("pool %s: replica %s left out: %s", pool, address, err)
                return None
            return {p.adapter: p.version for p in policies if p.pool == pool}

        return dict(zip(addresses, await asyncio.gather(*(one(a) for a in addresses)), strict=True))

    async def _sync_replicas(
        self, state: PoolState, probed: dict[str, dict[str, int] | None] | None = None
    ) -> None:
        """Push to each replica whose served versions differ from what this trainer last pushed
        (before its first push: from the version it holds); one that does not answer is dropped.
        `probed`: what each served a moment ago (_probe), asked now for those it lacks."""
        held = self._pushed or {
            adapter: state.version for adapter in (state.spec.agents if state.lora else [""])
        }
        addresses = list(state.spec.rollout_addresses)
        probed = dict(probed or {})
        probed.update(await self._probe([a for a in addresses if a not in probed], state.spec.pool))
        self._drop_replicas(state, [a for a in addresses if probed[a] is None])
        lagging = [
            a
            for a in addresses
            if probed[a] is not None
            and any(probed[a].get(adapter, -1) != v for adapter, v in held.items())
        ]
        if lagging:
            await self._push(
                state, state.spec.agents if state.lora else [], rollback=True, addresses=lagging
            )

    def need_state(self) -> PoolState:
        if self.state is None:
            raise FailedPrecondition("the trainer has no pool yet; call Setup first")
        return self.state

    async def train(
        self,
        run_id: str,
        step: int,
        expected_version: int,
        samples: Sequence[TrainSample],
        cfg: UpdateConfig,
    ) -> TrainResult:
        async with self._lock:
            state = self.need_state()
            if (run_id, step) in self._done:
                done = self._done[(run_id, step)]
                return TrainResult(
                    done.run_id, done.step, done.version, done.metrics, done.agents, replayed=True
                )
            if run_id != state.spec.run_id:
                raise FailedPrecondition(
                    f"samples of run {run_id!r}; this trainer serves {state.spec.run_id!r}"
                )
            if expected_version != state.version:
                raise FailedPrecondition(
                    f"the samples were drawn from version {expected_version}, the pool is at "
                    f"{state.version}: recollect with the current weights (on-policy)"
                )
            validate(samples, state.spec.agents, state.update_settings.micro_batch_tokens)
            staleness = staleness_max(samples, state.version, cfg.max_staleness)
            lags = sample_staleness(samples, state.version)
            start = time.perf_counter()
            metrics = await self._run("train", samples, cfg)
            metrics["train_seconds"] = time.perf_counter() - start
            metrics["matmul_flops_per_s"] = self.ops.matmul_rate
            metrics["tokens"] = float(sum(len(s.response_ids) for s in samples))
            metrics["samples"] = float(len(samples))
            metrics["staleness_max"] = float(staleness)
            metrics["staleness_mean"] = sum(lags) / len(lags)
            # Every adapter goes out, trained or not, so each of the pool's policies is at the
            # pool's version: what the router pins in Collect and this check allows.
            push_s, push_bytes = await self._push(state, state.spec.agents if state.lora else [])
            # the update and the push, as the router waits on both
            busy = time.perf_counter() - start
            metrics.update(
                push_seconds=push_s, push_bytes=float(push_bytes), **await self._run("release")
            )
            agents = {
                a: {
                    "samples": float(sum(s.agent == a for s in samples)),
                    "tokens": float(sum(len(s.response_ids) for s in samples if s.agent == a)),
                    **(
                        {"grad_norm": metrics.pop(f"grad_norm/{a}")}
                        if f"grad_norm/{a}" in metrics
                        else {}
                    ),
                }
                for a in sorted({s.agent for s in samples})
            }
            result = TrainResult(run_id, step, state.version, metrics, agents)
            telemetry.observe_update(
                run_id,
                state.spec.pool,
                state.version,
                metrics,
                agents,
                staleness=lags,
                busy_seconds=busy,
            )
            self._done[(run_id, step)] = result
            while len(self._done) > REPLAYED:
                del self._done[next(iter(self._done))]
            every = state.spec.checkpoint_every_updates
            if every and state.spec.checkpoint_dir and state.updates % every == 0:
                await self._run("save", self._default_dir(state))
            return result

    @staticmethod
    def _default_dir(state: PoolState) -> str:
        return str(Path(state.spec.checkpoint_dir) / f"version-{state.version}")

    async def _push(
        self,
        state: PoolState,
        agents: Sequence[str],
        *,
        rollback: bool = False,
        addresses: Sequence[str] | None = None,
    ) -> tuple[float, int]:
        """New weights to every replica at once; answers once all acknowledged (on-policy). A
        replica lost on the way is dropped from the pool's list (_drop_replicas)."""
        addresses = state.spec.rollout_addresses if addresses is None else addresses
        if not addresses:
            return 0.0, 0
        payloads = await self._run("weights", agents)
        start = time.perf_counter()
        with telemetry.push_failures(state.spec.run_id, state.spec.pool):
            total, lost = await push_weights_each(
                addresses, payloads, state.spec.pool, state.version, rollback=rollback
            )
        self._drop_replicas(state, lost)
        self._pushed.update({adapter: state.version for adapter, _, _ in payloads})
        seconds = time.perf_counter() - start
        telemetry.observe_push(state.spec.run_id, state.spec.pool, seconds, total)
        return seconds, total

    async def save_checkpoint(self, where: str = "") -> tuple[Path, int]:
        async with self._lock:
            state = self.need_state()
            if not where:
                if not state.spec.checkpoint_dir:
                    raise InvalidArgument(
                        "no checkpoint directory: pass dir, or set checkpoint_dir in Setup"
                    )
                where = self._default_dir(state)
            path = await self._run("save", where)
            return path, state.version

    async def delete_checkpoint(self, where: str) -> bool:
        """Rank 0 wrote the checkpoint (PoolState.save), so rank 0 alone deletes it."""
        async with self._lock:
            state = self.need_state()
            return await asyncio.to_thread(delete_checkpoint, where, state.spec)

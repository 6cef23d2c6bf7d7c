"""TrainerClient: Setup, Train (a header, then the samples) and SaveCheckpoint, in plain types
(atgrpo.contract.trainer)."""

from __future__ import annotations

from collections.abc import Sequence

from atgrpo._proto.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc
from atgrpo.contract import trainer_wire
from atgrpo.contract.trainer import (
    PoolSpec,
    SavedCheckpoint,
    TrainerInfo,
    TrainResult,
    TrainSample,
    UpdateConfig,
)
from atgrpo.rpc.client import ServiceClient


class TrainerClient(ServiceClient):
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    async def get_info(self) -> TrainerInfo:
        return trainer_wire.info_from_pb(
            await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())
        )

    async def setup(
        self,
        spec: PoolSpec,
        *,
        resume_from: str = "",
        reload: bool = False,
        replicas_only: bool = False,
        timeout_s: float = 600.0,
    ) -> TrainerInfo:
        """Set the pool up for a run (idempotent for the same run); `resume_from` a checkpoint
        folder, `reload` even when it already serves that run (a rollback). `replicas_only`: only
        hand over spec.rollout_addresses to a trainer that holds the run already."""
        req = trainer_wire.spec_to_pb(
            spec, resume_from=resume_from, reload=reload, replicas_only=replicas_only
        )
        return trainer_wire.info_from_pb(
            await self._call(self.stub.Setup, req, timeout_s=timeout_s)
        )

    async def train(
        self,
        run_id: str,
        step: int,
        expected_version: int,
        samples: Sequence[TrainSample],
        update: UpdateConfig | None = None,
        timeout_s: float = 3600.0,
    ) -> TrainResult:
        def stream():  # a fresh stream for every attempt
            return trainer_wire.train_stream(
                run_id, step, expected_version, samples, update or UpdateConfig()
            )

        return trainer_wire.result_from_pb(
            await self._call(self.stub.Train, stream, timeout_s=timeout_s)
        )

    async def save_checkpoint(
        self, where: str = "", timeout_s: float | None = None, nbytes: int = 0
    ) -> SavedCheckpoint:
        """Save to `where` (empty: the pool's checkpoint_dir/version-N). The deadline is
        `timeout_s`,
        else one for `nbytes` (TrainerInfo.checkpoint_bytes) written at a slow volume's pace."""
        resp = await self._call(
            self.stub.SaveCheckpoint,
            trainer_pb2.SaveCheckpointRequest(dir=where),
            timeout_s=timeout_s or checkpoint_deadline_s(nbytes),
        )
        return SavedCheckpoint(resp.path, resp.version)

    async def delete_checkpoint(self, where: str, nbytes: int = 0) -> bool:
        """Delete a checkpoint folder this pool saved; False when it was already gone."""
        # unlinks, not writes
        resp = await self._call(
            self.stub.DeleteCheckpoint,
            trainer_pb2.DeleteCheckpointRequest(dir=where),
            timeout_s=checkpoint_deadline_s(nbytes // 10),
        )
        return resp.deleted


# A checkpoint's deadline: a fixed part (the gather onto rank 0, opening files) and the bytes at
# 50 MB/s, a slow network volume's pace (a cloud disk's baseline is 125 MB/s and up): 10 minutes
# for a tiny model, 10 + 38 minutes for a full bf16 Qwen3-8B's 115 GB.
SAVE_FIXED_S = 600.0
SAVE_BYTES_PER_S = 50e6


def checkpoint_deadline_s(nbytes: int) -> float:
    return SAVE_FIXED_S + max(0, nbytes) / SAVE_BYTES_PER_S

"""TrainerClient: Setup, Train (a header, then the samples) and SaveCheckpoint."""

from __future__ import annotations

from collections.abc import Sequence

from atgrpo._proto.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc
from atgrpo.rpc.client import ServiceClient
from rollout_svc.convert import sampling_to_pb
from trainer_svc.update import TrainSample


class TrainerClient(ServiceClient):
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    async def get_info(self) -> trainer_pb2.TrainerInfo:
        return await self._call(self.stub.GetInfo, common_pb2.GetInfoRequest())

    async def setup(self, request: trainer_pb2.SetupRequest, timeout_s: float = 600.0) -> trainer_pb2.TrainerInfo:
        return await self._call(self.stub.Setup, request, timeout_s=timeout_s)

    async def train(self, run_id: str, step: int, expected_version: int, samples: Sequence[TrainSample],
                    loss: trainer_pb2.LossParams | None = None, timeout_s: float = 3600.0) -> trainer_pb2.TrainResponse:
        def stream():
            yield trainer_pb2.TrainRequest(header=trainer_pb2.TrainHeader(
                run_id=run_id, step=step, expected_version=expected_version, num_samples=len(samples),
                loss=loss or trainer_pb2.LossParams()))
            for s in samples:
                yield trainer_pb2.TrainRequest(sample=trainer_pb2.TrainSample(
                    agent=s.agent, prompt_token_ids=list(s.prompt_ids), response_token_ids=list(s.response_ids),
                    response_logprobs=list(s.old_logprobs), advantage=s.advantage, sampling=sampling_to_pb(s.sampling)))
        return await self._call(self.stub.Train, stream, timeout_s=timeout_s)

    async def save_checkpoint(self, where: str = "", timeout_s: float = 600.0) -> trainer_pb2.SaveCheckpointResponse:
        return await self._call(self.stub.SaveCheckpoint, trainer_pb2.SaveCheckpointRequest(dir=where),
                                timeout_s=timeout_s)

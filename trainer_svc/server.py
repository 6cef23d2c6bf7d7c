"""TrainerService servicer: converts and delegates to the Trainer. On a pool over several
ranks (torchrun) only rank 0 runs it; its Trainer forwards each operation to the other ranks."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

from grpc import aio

from atgrpo._proto.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc
from atgrpo.algo.registry import policy_loss_named
from atgrpo.contract import trainer_wire
from atgrpo.contract.rollout_wire import check_address
from atgrpo.contract.trainer import TrainerInfo, TrainSample, UpdateConfig, update_problems
from atgrpo.errors import FailedPrecondition, InvalidArgument, NotFound
from atgrpo.rpc.server import Binding, service_info
from trainer_svc.distributed import Ranks
from trainer_svc.settings import TrainerSettings
from trainer_svc.trainer import Trainer

MAX_SAMPLES = 1_000_000


def _check(where: str, rules: list[tuple[str, float, bool, str]]) -> None:
    """INVALID_ARGUMENT naming every (field, value) whose rule fails; NaN fails every rule."""
    bad = [
        f"{name} {value} must be {requirement}"
        for name, value, ok, requirement in rules
        if not (ok and math.isfinite(value))
    ]
    if bad:
        raise InvalidArgument(f"{where}: " + "; ".join(bad) + " (0 = the default)")


DTYPES = ("auto", "float32", "bfloat16", "float16")


def _is_dir(path: str, holding: str = "") -> bool:
    try:
        return (Path(path) / holding).is_file() if holding else Path(path).is_dir()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _check_where(m: trainer_pb2.SetupRequest) -> None:
    """The model, the checkpoint and the device must be there on this trainer's machine."""
    import torch

    device, dtype = m.device or "auto", m.dtype or "auto"
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise InvalidArgument(f"device {device!r}: use 'auto', 'cpu' or 'cuda'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FailedPrecondition(
            f"device {device!r}, but this trainer has no CUDA device; use 'cpu' or 'auto'"
        )
    if dtype not in DTYPES:
        raise InvalidArgument(f"dtype {dtype!r}: use one of {list(DTYPES)}")
    if not _is_dir(m.model_path):
        raise NotFound(
            f"model_path {m.model_path!r} is not a directory on the trainer's machine; give a "
            f"local "
            "model directory (e.g. one built with `atgrpo model tiny --out DIR`)"
        )
    if m.resume_from and not _is_dir(m.resume_from, "atgrpo.json"):
        raise NotFound(
            f"resume_from {m.resume_from!r} is not a checkpoint directory on the trainer's machine "
            "(it has no atgrpo.json); give one that SaveCheckpoint wrote, or leave it empty"
        )


def check_setup(m: trainer_pb2.SetupRequest) -> None:
    """INVALID_ARGUMENT (or NOT_FOUND for what this machine lacks) before anything is set up."""
    if not m.run_id or not m.pool or not m.model_path or not m.agents:
        raise InvalidArgument("Setup needs run_id, pool, model_path and agents")
    o, lora = m.optim, m.lora
    _check(
        "Setup optim",
        [
            ("lr", o.lr, o.lr >= 0, "> 0"),
            ("weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0"),
            ("warmup_steps", o.warmup_steps, o.warmup_steps >= 0, ">= 0"),
            ("total_steps", o.total_steps, o.total_steps >= 0, ">= 1"),
            ("min_lr_ratio", o.min_lr_ratio, 0 <= o.min_lr_ratio <= 1, "in [0, 1]"),
            ("grad_clip", o.grad_clip, o.grad_clip >= 0, "> 0"),
            ("beta1", o.beta1, 0 <= o.beta1 < 1, "in [0, 1)"),
            ("beta2", o.beta2, 0 <= o.beta2 < 1, "in [0, 1)"),
        ],
    )
    _check_where(m)
    for i, address in enumerate(m.rollout_addresses):
        check_address(address, f"rollout_addresses[{i}]")
    _check(
        "Setup lora",
        [
            ("rank", lora.rank, lora.rank >= 0, ">= 1"),
            ("alpha", lora.alpha, lora.alpha >= 0, "> 0"),
            ("dropout", lora.dropout, 0 <= lora.dropout < 1, "in [0, 1)"),
        ],
    )


def check_update(update: UpdateConfig) -> None:
    """The update settings as the trainer will use them (converted: 0 = the default) against the
    one table of bounds the run config is checked with (atgrpo.contract.trainer.UPDATE_BOUNDS),
    and the policy loss against the registry."""
    bad = update_problems(update)
    if bad:
        # 0 is the default for every field but behav_imp_cap, where it turns the correction off
        raise InvalidArgument(
            "Train update: " + "; ".join(bad) + " (0 = the default; behav_imp_cap 0 = off)"
        )
    try:
        policy_loss_named(update.loss.policy_loss)
    except KeyError as err:
        raise InvalidArgument(f"Train update.policy_loss: {err.args[0]}") from None


def _vocab_size(state) -> int | None:
    try:
        return state.model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return None


def _check_token_ids(samples: list[TrainSample], vocab: int | None) -> None:
    if not vocab:
        return
    for i, s in enumerate(samples):
        for what, ids in (("prompt", s.prompt_ids), ("response", s.response_ids)):
            if ids and (min(ids) < 0 or max(ids) >= vocab):
                bad = next(t for t in ids if not 0 <= t < vocab)
                raise InvalidArgument(
                    f"sample {i} (agent {s.agent!r}): {what} token id {bad} is not in the "
                    f"model's vocabulary [0, {vocab}); nothing was trained"
                )


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        ranks = trainer.ranks.world_size if trainer.ranks else 1
        self._service = service_info(
            "trainer",
            {"pool": trainer.pool_name, "ranks": str(ranks), "sharding": trainer.ops.sharding},
        )

    def _info(self) -> trainer_pb2.TrainerInfo:
        state = self.trainer.state
        if state is None:
            return trainer_wire.info_to_pb(TrainerInfo(pool=self.trainer.pool_name), self._service)
        s = state.spec
        return trainer_wire.info_to_pb(
            TrainerInfo(
                s.pool,
                s.run_id,
                state.version,
                s.agents,
                s.specialization,
                s.device,
                s.rollout_addresses,
                checkpoint_bytes=state.checkpoint_bytes(),
            ),
            self._service,
        )

    async def GetInfo(
        self, request: common_pb2.GetInfoRequest, context: aio.ServicerContext
    ) -> trainer_pb2.TrainerInfo:
        return self._info()

    async def Setup(
        self, request: trainer_pb2.SetupRequest, context: aio.ServicerContext
    ) -> trainer_pb2.TrainerInfo:
        check_setup(request)
        spec = trainer_wire.spec_from_pb(request)
        await self.trainer.setup(
            spec, request.resume_from, request.reload, replicas_only=request.replicas_only
        )
        return self._info()

    async def Train(
        self,
        request_iterator: AsyncIterator[trainer_pb2.TrainRequest],
        context: aio.ServicerContext,
    ) -> trainer_pb2.TrainResponse:
        header, samples = None, []
        async for part in request_iterator:
            kind = part.WhichOneof("part")
            if header is None:
                if kind != "header":
                    raise InvalidArgument("a Train stream must start with a header")
                header = part.header
                continue
            if kind != "sample":
                raise InvalidArgument("only the first message of a Train stream may be a header")
            if len(samples) >= MAX_SAMPLES:
                raise InvalidArgument(
                    f"more than {MAX_SAMPLES} samples in one Train call; split the step"
                )
            samples.append(trainer_wire.sample_from_pb(part.sample, f"sample {len(samples)}"))
        if header is None:
            raise InvalidArgument("empty Train stream; send a header, then the samples")
        if header.num_samples != len(samples):
            raise InvalidArgument(
                f"the header announced {header.num_samples} samples, {len(samples)} arrived; "
                "nothing was trained, resend the step"
            )
        update = trainer_wire.update_from_pb(header.update)
        check_update(update)
        state = self.trainer.need_state()
        _check_token_ids(samples, _vocab_size(state))
        result = await self.trainer.train(
            header.run_id, header.step, header.expected_version, samples, update
        )
        return trainer_wire.result_to_pb(result, state.spec.pool)

    async def SaveCheckpoint(
        self, request: trainer_pb2.SaveCheckpointRequest, context: aio.ServicerContext
    ) -> trainer_pb2.SaveCheckpointResponse:
        path, version = await self.trainer.save_checkpoint(request.dir)
        return trainer_pb2.SaveCheckpointResponse(path=str(path), version=version)

    async def DeleteCheckpoint(
        self, request: trainer_pb2.DeleteCheckpointRequest, context: aio.ServicerContext
    ) -> trainer_pb2.DeleteCheckpointResponse:
        if not request.dir:
            raise InvalidArgument(
                "DeleteCheckpoint needs dir: the folder SaveCheckpoint answered with"
            )
        return trainer_pb2.DeleteCheckpointResponse(
            deleted=await self.trainer.delete_checkpoint(request.dir)
        )


def bindings(
    settings: TrainerSettings | None = None,
    trainer: Trainer | None = None,
    ranks: Ranks | None = None,
) -> list[Binding]:
    """`ranks`: this is rank 0 of a pool over several ranks (torchrun); the others follow it."""
    settings = settings or TrainerSettings()
    trainer = trainer or Trainer(
        settings.pool, settings.sharding, ranks, settings.micro_batch_tokens
    )
    return [
        Binding(
            "atgrpo.v1.TrainerService",
            TrainerServicer(trainer),
            trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        )
    ]

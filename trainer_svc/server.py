"""TrainerService servicer: converts and delegates to the Trainer. On a pool over several
ranks (torchrun) only rank 0 runs it; its Trainer forwards each operation to the other ranks."""

from __future__ import annotations

import math
from pathlib import Path

from atgrpo._proto.v1 import trainer_pb2, trainer_pb2_grpc
from atgrpo.algo.loss import LossConfig
from atgrpo.errors import FailedPrecondition, InvalidArgument, NotFound
from atgrpo.rpc.server import Binding, service_info
from rollout_svc.convert import check_address, sampling_from_pb
from trainer_svc.distributed import Ranks
from trainer_svc.state import PoolSpec
from trainer_svc.trainer import Trainer
from trainer_svc.update import TrainSample, UpdateConfig

MAX_SAMPLES = 1_000_000


def _check(where: str, rules: list[tuple[str, float, bool, str]]) -> None:
    """INVALID_ARGUMENT naming every (field, value) whose rule fails; NaN fails every rule."""
    bad = [f"{name} {value} must be {requirement}" for name, value, ok, requirement in rules
           if not (ok and math.isfinite(value))]
    if bad:
        raise InvalidArgument(f"{where}: " + "; ".join(bad) + " (0 = the default)")


DTYPES = ("auto", "float32", "bfloat16", "float16")


def _is_dir(path: str, holding: str = "") -> bool:
    try:
        return (Path(path) / holding).is_file() if holding else Path(path).is_dir()
    except (OSError, ValueError):   # a name too long for the file system, a NUL byte
        return False


def _check_where(m: trainer_pb2.SetupRequest) -> None:
    """The model, the checkpoint and the device must be there on this trainer's machine."""
    import torch

    device, dtype = m.device or "auto", m.dtype or "auto"
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise InvalidArgument(f"device {device!r}: use 'auto', 'cpu' or 'cuda'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FailedPrecondition(f"device {device!r}, but this trainer has no CUDA device; use 'cpu' or 'auto'")
    if dtype not in DTYPES:
        raise InvalidArgument(f"dtype {dtype!r}: use one of {list(DTYPES)}")
    if not _is_dir(m.model_path):
        raise NotFound(f"model_path {m.model_path!r} is not a directory on the trainer's machine; give a local "
                       "model directory (e.g. one built with `atgrpo model tiny --out DIR`)")
    if m.resume_from and not _is_dir(m.resume_from, "atgrpo.json"):
        raise NotFound(f"resume_from {m.resume_from!r} is not a checkpoint directory on the trainer's machine "
                       "(it has no atgrpo.json); give one that SaveCheckpoint wrote, or leave it empty")


def spec_from_pb(m: trainer_pb2.SetupRequest) -> PoolSpec:
    if not m.run_id or not m.pool or not m.model_path or not m.agents:
        raise InvalidArgument("Setup needs run_id, pool, model_path and agents")
    o, lora = m.optim, m.lora
    _check("Setup optim", [
        ("lr", o.lr, o.lr >= 0, "> 0"), ("weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0"),
        ("warmup_steps", o.warmup_steps, o.warmup_steps >= 0, ">= 0"),
        ("total_steps", o.total_steps, o.total_steps >= 0, ">= 1"),
        ("min_lr_ratio", o.min_lr_ratio, 0 <= o.min_lr_ratio <= 1, "in [0, 1]"),
        ("grad_clip", o.grad_clip, o.grad_clip >= 0, "> 0"),
        ("beta1", o.beta1, 0 <= o.beta1 < 1, "in [0, 1)"), ("beta2", o.beta2, 0 <= o.beta2 < 1, "in [0, 1)")])
    _check_where(m)
    for i, address in enumerate(m.rollout_addresses):
        check_address(address, f"rollout_addresses[{i}]")
    _check("Setup lora", [
        ("rank", lora.rank, lora.rank >= 0, ">= 1"), ("alpha", lora.alpha, lora.alpha >= 0, "> 0"),
        ("dropout", lora.dropout, 0 <= lora.dropout < 1, "in [0, 1)")])
    return PoolSpec(
        run_id=m.run_id, pool=m.pool, model_path=m.model_path, agents=tuple(m.agents),
        specialization=m.specialization or "full", lora_rank=lora.rank or 16, lora_alpha=lora.alpha or 32.0,
        lora_dropout=lora.dropout, lora_targets=tuple(lora.target_modules) or ("q_proj", "k_proj", "v_proj", "o_proj"),
        lr=o.lr or 1e-6, weight_decay=o.weight_decay, betas=(o.beta1 or 0.9, o.beta2 or 0.999),
        warmup_steps=o.warmup_steps, total_steps=o.total_steps or 100, min_lr_ratio=o.min_lr_ratio,
        grad_clip=o.grad_clip or 1.0,
        device=m.device or "auto", dtype=m.dtype or "auto", seed=m.seed, checkpoint_dir=m.checkpoint_dir,
        checkpoint_every_updates=m.checkpoint_every_updates,
        rollout_addresses=tuple(m.rollout_addresses))


MAX_EPOCHS = 1000


def update_config_from_pb(loss: trainer_pb2.LossParams, micro_batch_tokens: int, grad_clip: float) -> UpdateConfig:
    _check("Train loss", [
        ("clip_eps_low", loss.clip_eps_low, 0 <= loss.clip_eps_low < 1, "in (0, 1)"),
        ("clip_eps_high", loss.clip_eps_high, 0 <= loss.clip_eps_high < 1, "in (0, 1)"),
        ("dual_clip_c", loss.dual_clip_c, loss.dual_clip_c == 0 or loss.dual_clip_c > 1, "> 1"),
        ("kl_coef", loss.kl_coef, loss.kl_coef >= 0, ">= 0"),
        ("entropy_coef", loss.entropy_coef, loss.entropy_coef >= 0, ">= 0"),
        ("epochs", loss.epochs, 0 <= loss.epochs <= MAX_EPOCHS, f"between 1 and {MAX_EPOCHS}"),
        ("mini_batch_size", loss.mini_batch_size, loss.mini_batch_size >= 0, ">= 1")])
    return UpdateConfig(
        loss=LossConfig(loss.clip_eps_low or 0.2, loss.clip_eps_high or 0.2, loss.dual_clip_c or 3.0,
                        loss.kl_coef, loss.entropy_coef),
        epochs=loss.epochs or 1, mini_batch_size=loss.mini_batch_size or 16,
        micro_batch_tokens=micro_batch_tokens, grad_clip=grad_clip)


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
                raise InvalidArgument(f"sample {i} (agent {s.agent!r}): {what} token id {bad} is not in the "
                                      f"model's vocabulary [0, {vocab}); nothing was trained")


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, trainer: Trainer, micro_batch_tokens: int = 8192) -> None:
        self.trainer = trainer
        self.micro_batch_tokens = micro_batch_tokens
        ranks = trainer.ranks.world_size if trainer.ranks else 1
        self._service = service_info("trainer", {"pool": trainer.pool_name, "ranks": str(ranks),
                                                 "sharding": trainer.ops.sharding})

    def _info(self) -> trainer_pb2.TrainerInfo:
        state = self.trainer.state
        if state is None:
            return trainer_pb2.TrainerInfo(service=self._service, pool=self.trainer.pool_name)
        s = state.spec
        return trainer_pb2.TrainerInfo(service=self._service, run_id=s.run_id, pool=s.pool, version=state.version,
                                       agents=s.agents, specialization=s.specialization, device=s.device,
                                       rollout_addresses=s.rollout_addresses)

    async def GetInfo(self, request, context):
        return self._info()

    async def Setup(self, request, context):
        await self.trainer.setup(spec_from_pb(request), request.resume_from, request.reload)
        if request.micro_batch_tokens > 0:      # the run's budget; the --micro-batch-tokens flag is the default
            self.micro_batch_tokens = request.micro_batch_tokens
        return self._info()

    async def Train(self, request_iterator, context):
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
                raise InvalidArgument(f"more than {MAX_SAMPLES} samples in one Train call; split the step")
            s = part.sample
            samples.append(TrainSample(s.agent, list(s.prompt_token_ids), list(s.response_token_ids),
                                       list(s.response_logprobs), s.advantage,
                                       sampling_from_pb(s.sampling, f"sample {len(samples)} sampling")))
        if header is None:
            raise InvalidArgument("empty Train stream; send a header, then the samples")
        if header.num_samples != len(samples):
            raise InvalidArgument(f"the header announced {header.num_samples} samples, {len(samples)} arrived; "
                                  "nothing was trained, resend the step")
        state = self.trainer.need_state()
        _check_token_ids(samples, _vocab_size(state))
        result = await self.trainer.train(header.run_id, header.step, header.expected_version, samples,
                                          update_config_from_pb(header.loss, self.micro_batch_tokens,
                                                                state.spec.grad_clip))
        m = result.metrics
        return trainer_pb2.TrainResponse(
            run_id=result.run_id, step=result.step, pool=self.trainer.state.spec.pool, version=result.version,
            replayed=result.replayed, loss=m["loss"], clip_fraction=m["clip_fraction"], approx_kl=m["approx_kl"],
            entropy=m["entropy"], grad_norm=m["grad_norm"] if math.isfinite(m["grad_norm"]) else -1.0,
            tokens=int(m["tokens"]), samples=int(m["samples"]), train_seconds=m["train_seconds"],
            push_seconds=m["push_seconds"], push_bytes=int(m["push_bytes"]),
            agents={a: trainer_pb2.AgentTrainMetrics(samples=int(v["samples"]), tokens=int(v["tokens"]))
                    for a, v in result.agents.items()})

    async def SaveCheckpoint(self, request, context):
        path, version = await self.trainer.save_checkpoint(request.dir)
        return trainer_pb2.SaveCheckpointResponse(path=str(path), version=version)


def bindings(args=None, trainer: Trainer | None = None, ranks: Ranks | None = None) -> list[Binding]:
    """`ranks`: this is rank 0 of a pool over several ranks (torchrun); the others follow it."""
    pool = getattr(args, "pool", "")
    tokens = getattr(args, "micro_batch_tokens", 8192)
    trainer = trainer or Trainer(pool, getattr(args, "sharding", "auto"), ranks)
    return [Binding("atgrpo.v1.TrainerService", TrainerServicer(trainer, tokens),
                    trainer_pb2_grpc.add_TrainerServiceServicer_to_server)]

"""TrainerService servicer: converts and delegates to the Trainer. On a pool over several
ranks (torchrun) only rank 0 runs it; its Trainer forwards each operation to the other ranks."""

from __future__ import annotations

import math

from atgrpo._proto.v1 import trainer_pb2, trainer_pb2_grpc
from atgrpo.algo.loss import LossConfig
from atgrpo.errors import InvalidArgument
from atgrpo.rpc.server import Binding, service_info
from rollout_svc.convert import sampling_from_pb
from trainer_svc.distributed import Ranks
from trainer_svc.state import PoolSpec
from trainer_svc.trainer import Trainer
from trainer_svc.update import TrainSample, UpdateConfig

MAX_SAMPLES = 1_000_000


def spec_from_pb(m: trainer_pb2.SetupRequest) -> PoolSpec:
    if not m.run_id or not m.pool or not m.model_path or not m.agents:
        raise InvalidArgument("Setup needs run_id, pool, model_path and agents")
    o, lora = m.optim, m.lora
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


def update_config_from_pb(loss: trainer_pb2.LossParams, micro_batch_tokens: int, grad_clip: float) -> UpdateConfig:
    return UpdateConfig(
        loss=LossConfig(loss.clip_eps_low or 0.2, loss.clip_eps_high or 0.2, loss.dual_clip_c or 3.0,
                        loss.kl_coef, loss.entropy_coef),
        epochs=loss.epochs or 1, mini_batch_size=loss.mini_batch_size or 16,
        micro_batch_tokens=micro_batch_tokens, grad_clip=grad_clip)


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
                                       list(s.response_logprobs), s.advantage, sampling_from_pb(s.sampling)))
        if header is None:
            raise InvalidArgument("empty Train stream; send a header, then the samples")
        if header.num_samples != len(samples):
            raise InvalidArgument(f"the header announced {header.num_samples} samples, {len(samples)} arrived; "
                                  "nothing was trained, resend the step")
        state = self.trainer.need_state()
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

"""What a run talks to (Clients: the env service, each pool's rollout fleet, each trainable pool's
trainer) and what it tells a trainer at setup (pool_spec, from the run config)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atgrpo.config import RunConfig
from atgrpo.contract.trainer import PoolSpec
from atgrpo.errors import InvalidArgument
from env_svc.client import EnvClient
from router_svc.fleet import Fleet
from trainer_svc.client import TrainerClient


@dataclass
class Clients:
    env: EnvClient
    rollout: Fleet  # each pool's replicas as they come and go
    trainers: dict[str, TrainerClient]  # trainable pool -> client

    @classmethod
    def connect(cls, cfg: RunConfig) -> Clients:
        s = cfg.services
        if cfg.local_mode:
            raise InvalidArgument(
                "the config names no service addresses; the router drives running services. "
                "Use `atgrpo train CONFIG`, which starts them locally, or fill in services:"
            )
        trainable = [p for p, pool in cfg.pools.items() if pool.trainable]
        return cls(
            EnvClient(s.env),
            Fleet(s.rollout, trainable),
            {p: TrainerClient(s.trainer[p]) for p in trainable},
        )

    async def close(self) -> None:
        await self.rollout.close()
        for c in [self.env, *self.trainers.values()]:
            await c.close()


def pool_spec(
    cfg: RunConfig, pool: str, checkpoint_root: str, replicas: Sequence[str] = ()
) -> PoolSpec:
    """A trainable pool's setup for this run, from the config; `replicas`: the pool's rollout
    replicas now (the config may name them by DNS or a file, atgrpo.discovery)."""
    p = cfg.pools[pool]
    lora = p.lora
    return PoolSpec(
        run_id=cfg.run.name,
        pool=pool,
        model_path=p.model_path,
        agents=tuple(cfg.agents_of(pool)),
        specialization=p.specialization,
        **(
            dict(
                lora_rank=lora.rank,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                lora_targets=tuple(lora.target_modules),
            )
            if lora
            else {}
        ),
        lr=p.optim.lr,
        weight_decay=p.optim.weight_decay,
        betas=p.optim.betas,
        warmup_steps=p.optim.warmup_steps,
        total_steps=cfg.run.steps,
        min_lr_ratio=p.optim.min_lr_ratio,
        grad_clip=p.optim.grad_clip,
        device=p.device,
        dtype=p.dtype,
        seed=cfg.run.seed,
        checkpoint_dir=checkpoint_root,
        checkpoint_every_updates=0,  # the router keeps the cadence
        rollout_addresses=tuple(replicas),
        micro_batch_tokens=p.micro_batch_tokens,
        gradient_checkpointing=p.gradient_checkpointing,
    )

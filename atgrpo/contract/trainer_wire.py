"""Protobuf <-> atgrpo.contract.trainer. Unset (0) fields of a request take the defaults of the
plain types; the trainer's servicer checks a request's ranges before it converts."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from atgrpo._proto.v1 import common_pb2
from atgrpo._proto.v1 import trainer_pb2 as pb
from atgrpo.contract.rollout_wire import sampling_from_pb, sampling_to_pb
from atgrpo.contract.service_wire import service_info_from_pb
from atgrpo.contract.trainer import (
    MISMATCH_KEYS,
    LossConfig,
    PoolSpec,
    TrainerInfo,
    TrainResult,
    TrainSample,
    UpdateConfig,
)

_DEFAULT = PoolSpec(run_id="", pool="", model_path="", agents=())
_FIGURES = ("loss", "clip_fraction", "approx_kl", "entropy", "train_seconds", "push_seconds")
_COUNTS = ("tokens", "samples", "push_bytes", "staleness_max", "masked_tokens")
# Where the update's time went (TrainResponse.timing).
_TIMING = (
    "time_forward_s",
    "time_backward_s",
    "time_optimizer_s",
    "update_tokens",
    "update_flops",
    "matmul_flops_per_s",
)
# The trainer's memory after the update (TrainResponse.memory; trainer.PoolOps.release).
MEMORY = ("rss_gb", "rss_released_gb", "rss_peak_gb")


def spec_to_pb(
    s: PoolSpec, *, resume_from: str = "", reload: bool = False, replicas_only: bool = False
) -> pb.SetupRequest:
    return pb.SetupRequest(
        run_id=s.run_id,
        pool=s.pool,
        model_path=s.model_path,
        specialization=s.specialization,
        lora=pb.LoraParams(
            rank=s.lora_rank,
            alpha=s.lora_alpha,
            dropout=s.lora_dropout,
            target_modules=list(s.lora_targets),
        ),
        agents=list(s.agents),
        optim=pb.OptimParams(
            lr=s.lr,
            weight_decay=s.weight_decay,
            warmup_steps=s.warmup_steps,
            min_lr_ratio=s.min_lr_ratio,
            grad_clip=s.grad_clip,
            beta1=s.betas[0],
            beta2=s.betas[1],
            total_steps=s.total_steps,
        ),
        device=s.device,
        dtype=s.dtype,
        micro_batch_tokens=s.micro_batch_tokens,
        seed=s.seed,
        rollout_addresses=list(s.rollout_addresses),
        checkpoint_dir=s.checkpoint_dir,
        resume_from=resume_from,
        checkpoint_every_updates=s.checkpoint_every_updates,
        reload=reload,
        replicas_only=replicas_only,
        gradient_checkpointing=s.gradient_checkpointing,
    )


def spec_from_pb(m: pb.SetupRequest) -> PoolSpec:
    o, lora, d = m.optim, m.lora, _DEFAULT
    return PoolSpec(
        run_id=m.run_id,
        pool=m.pool,
        model_path=m.model_path,
        agents=tuple(m.agents),
        specialization=m.specialization or d.specialization,
        lora_rank=lora.rank or d.lora_rank,
        lora_alpha=lora.alpha or d.lora_alpha,
        lora_dropout=lora.dropout,
        lora_targets=tuple(lora.target_modules) or d.lora_targets,
        lr=o.lr or d.lr,
        weight_decay=o.weight_decay,
        betas=(o.beta1 or d.betas[0], o.beta2 or d.betas[1]),
        warmup_steps=o.warmup_steps,
        total_steps=o.total_steps or d.total_steps,
        min_lr_ratio=o.min_lr_ratio,
        grad_clip=o.grad_clip or d.grad_clip,
        device=m.device or "auto",
        dtype=m.dtype or "auto",
        seed=m.seed,
        checkpoint_dir=m.checkpoint_dir,
        checkpoint_every_updates=m.checkpoint_every_updates,
        rollout_addresses=tuple(m.rollout_addresses),
        micro_batch_tokens=m.micro_batch_tokens,
        gradient_checkpointing=m.gradient_checkpointing
        if m.HasField("gradient_checkpointing")
        else None,
    )


def update_to_pb(u: UpdateConfig) -> pb.UpdateParams:
    """The router's settings of a step's update (all of UpdateConfig); the trainer's own
    (micro-batch budget, gradient clip, precision) come with its Setup."""
    loss = u.loss
    return pb.UpdateParams(
        clip_eps_low=loss.clip_eps_low,
        clip_eps_high=loss.clip_eps_high,
        dual_clip_c=loss.dual_clip_c,
        kl_coef=loss.kl_coef,
        entropy_coef=loss.entropy_coef,
        epochs=u.epochs,
        mini_batch_size=u.mini_batch_size,
        max_staleness=u.max_staleness,
        behav_imp_cap=loss.behav_imp_cap,
        policy_loss=loss.policy_loss,
    )


def update_from_pb(m: pb.UpdateParams) -> UpdateConfig:
    """The one conversion of a Train call's update settings; 0 (unset) takes the default."""
    d, dl = UpdateConfig(), LossConfig()
    # A client that predates behav_imp_cap sends none: it gets the default cap. Unlike the other
    # fields here, an explicit 0 is kept: it turns the correction off (LossConfig.behav_imp_cap);
    # routers before it never sent 0 (their bound was >= 1).
    cap = m.behav_imp_cap if m.HasField("behav_imp_cap") else dl.behav_imp_cap
    return UpdateConfig(
        loss=LossConfig(
            m.clip_eps_low or dl.clip_eps_low,
            m.clip_eps_high or dl.clip_eps_high,
            m.dual_clip_c or dl.dual_clip_c,
            m.kl_coef,
            m.entropy_coef,
            behav_imp_cap=cap,
            # "" (an older router): ppo_clip, decoupled by UpdateConfig.policy_loss when stale
            policy_loss=m.policy_loss or dl.policy_loss,
        ),
        epochs=m.epochs or d.epochs,
        mini_batch_size=m.mini_batch_size or d.mini_batch_size,
        max_staleness=m.max_staleness,
    )


def sample_to_pb(s: TrainSample) -> pb.TrainSample:
    return pb.TrainSample(
        agent=s.agent,
        prompt_token_ids=list(s.prompt_ids),
        response_token_ids=list(s.response_ids),
        response_logprobs=list(s.old_logprobs),
        advantage=s.advantage,
        sampling=sampling_to_pb(s.sampling),
        policy_version=s.policy_version,
    )


def sample_from_pb(m: pb.TrainSample, where: str = "sample") -> TrainSample:
    return TrainSample(
        m.agent,
        list(m.prompt_token_ids),
        list(m.response_token_ids),
        list(m.response_logprobs),
        m.advantage,
        sampling_from_pb(m.sampling, f"{where} sampling"),
        m.policy_version if m.HasField("policy_version") else None,
    )


def train_stream(
    run_id: str,
    step: int,
    expected_version: int,
    samples: Sequence[TrainSample],
    update: UpdateConfig,
) -> Iterator[pb.TrainRequest]:
    """A Train call's messages: the header, then one message per sample."""
    yield pb.TrainRequest(
        header=pb.TrainHeader(
            run_id=run_id,
            step=step,
            expected_version=expected_version,
            num_samples=len(samples),
            update=update_to_pb(update),
        )
    )
    for s in samples:
        yield pb.TrainRequest(sample=sample_to_pb(s))


def result_to_pb(r: TrainResult, pool: str) -> pb.TrainResponse:
    m = r.metrics
    # -1: no finite norm (nothing stepped)
    grad_norm = m["grad_norm"] if math.isfinite(m["grad_norm"]) else -1.0
    return pb.TrainResponse(
        run_id=r.run_id,
        step=r.step,
        pool=pool,
        version=r.version,
        replayed=r.replayed,
        grad_norm=grad_norm,
        kl_ref=m.get("kl_ref"),
        staleness_mean=m["staleness_mean"],
        **{k: m[k] for k in _FIGURES},
        **{k: int(m.get(k, 0)) for k in _COUNTS},
        timing={k: float(m[k]) for k in _TIMING},
        memory={k: float(m[k]) for k in MEMORY if k in m},
        mismatch={k: float(m[k]) for k in MISMATCH_KEYS if k in m},
        agents={
            a: pb.AgentTrainMetrics(
                samples=int(v["samples"]), tokens=int(v["tokens"]), grad_norm=v.get("grad_norm")
            )
            for a, v in r.agents.items()
        },
    )


def result_from_pb(m: pb.TrainResponse) -> TrainResult:
    metrics = {k: getattr(m, k) for k in (*_FIGURES, "grad_norm", "staleness_mean")} | {
        k: float(getattr(m, k)) for k in _COUNTS
    }
    if m.HasField("kl_ref"):
        metrics["kl_ref"] = m.kl_ref
    metrics.update(m.timing)
    metrics.update(m.memory)
    metrics.update(m.mismatch)
    agents = {
        a: {
            "samples": float(v.samples),
            "tokens": float(v.tokens),
            **({"grad_norm": v.grad_norm} if v.HasField("grad_norm") else {}),
        }
        for a, v in m.agents.items()
    }
    return TrainResult(m.run_id, m.step, m.version, metrics, agents, m.replayed)


def info_to_pb(i: TrainerInfo, service: common_pb2.ServiceInfo) -> pb.TrainerInfo:
    return pb.TrainerInfo(
        service=service,
        run_id=i.run_id,
        pool=i.pool,
        version=i.version,
        agents=list(i.agents),
        specialization=i.specialization,
        device=i.device,
        rollout_addresses=list(i.rollout_addresses),
        checkpoint_bytes=i.checkpoint_bytes,
    )


def info_from_pb(m: pb.TrainerInfo) -> TrainerInfo:
    return TrainerInfo(
        pool=m.pool,
        run_id=m.run_id,
        version=m.version,
        agents=tuple(m.agents),
        specialization=m.specialization,
        device=m.device,
        rollout_addresses=tuple(m.rollout_addresses),
        service=service_info_from_pb(m.service),
        checkpoint_bytes=m.checkpoint_bytes,
    )

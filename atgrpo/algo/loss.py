"""The AT-GRPO policy loss: token-level clipped PPO surrogate with dual clip, token-mean
aggregation, optional KL to a frozen reference and entropy bonus (DESIGN.md §1; dual clip as in
Ye et al. 2020 and verl's compute_policy_loss), and its decoupled form, whose ratio sits on the
trainer's own log-probs and whose truncated importance weight corrects from the rollout engine's
(samples drawn by older weights, max_staleness > 0, Fu et al. 2025, AReaL; and the engine's
numerical mismatch with the trainer, behav_imp_cap > 0, issue 59)."""

from __future__ import annotations

import torch

from atgrpo.algo.mismatch import LOG_RATIO_BOUND, in_support, truncated_weights
from atgrpo.algo.registry import register_policy_loss
from atgrpo.contract.trainer import LossConfig

# LOG_RATIO_BOUND (atgrpo.algo.mismatch): exp() of a log-ratio past ~88 overflows float32 and its
# gradient is NaN; verl clamps the log-ratio to +-20 before exp, where a clip has long taken over
# the token's loss anyway.

# verl's bound on a token's k3 estimate: one token the reference finds near-impossible must not
# swamp the KL term of the whole batch.
KL_TOKEN_BOUND = 10.0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean over every real token of the batch (not a mean of per-sequence means)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _finite(x: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """x where `ok`, else 0: keeps -inf out of the arithmetic (and NaN out of the gradients)."""
    return torch.where(ok, x, torch.zeros_like(x))


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) on tokens the policy sampled:
    exp(d) - d - 1 with d = ref - new; unbiased and >= 0 (Schulman 2020). Bounded as verl does."""
    d = torch.clamp(ref_logprobs - logprobs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.clamp(torch.exp(d) - d - 1, max=KL_TOKEN_BOUND)


def _clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    ok: torch.Tensor,
    cfg: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped PPO surrogate with dual clip, ratio exp(logprobs - old_logprobs), on the
    `ok` tokens (the others get a finite value the caller masks out). Returns (pg, clipped,
    log_ratio): `clipped` marks tokens whose loss a clip took over (no gradient), as verl and TRL
    count them: a ratio outside the range on the side its advantage does not push to is not
    clipped."""
    adv = advantages[:, None].to(logprobs.dtype)  # (B, 1)
    log_ratio = torch.clamp(
        _finite(logprobs, ok) - _finite(old_logprobs, ok), -LOG_RATIO_BOUND, LOG_RATIO_BOUND
    )
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    unclipped = -adv * ratio  # (B, T)
    pg = torch.maximum(unclipped, -adv * clipped_ratio)
    # Dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at -c * A.
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip_c), pg)
    return pg, pg != unclipped, log_ratio


def _surrogate_metrics(
    loss: torch.Tensor,
    clipped: torch.Tensor,
    log_ratio: torch.Tensor,
    m: torch.Tensor,
    masked: torch.Tensor,
) -> dict[str, float]:
    return {
        "pg_loss": loss.item(),
        "clip_fraction": masked_mean(clipped.to(m.dtype), m).item(),
        "approx_kl": masked_mean(0.5 * log_ratio**2, m).item(),  # to the ratio's denominator
        "masked_tokens": float(masked.sum()),
    }


def _regularised(
    loss: torch.Tensor,
    metrics: dict[str, float],
    logprobs: torch.Tensor,
    ok: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The surrogate plus the KL to the reference and minus the entropy bonus (each when asked)."""
    if cfg.kl_coef and ref_logprobs is not None:
        ok_ref = ok & torch.isfinite(ref_logprobs)
        kl = masked_mean(
            kl_k3(_finite(logprobs, ok_ref), _finite(ref_logprobs, ok_ref)),
            ok_ref.to(logprobs.dtype),
        )
        loss = loss + cfg.kl_coef * kl
        metrics["kl_ref"] = kl.item()
    if entropy is not None:
        ent = masked_mean(entropy, mask.to(entropy.dtype))
        metrics["entropy"] = ent.item()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    metrics["loss"] = loss.item()
    return loss, metrics


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise and its diagnostics.

    logprobs, old_logprobs, mask, ref_logprobs, entropy: (B, T), response tokens only (mask 1 on
    real tokens); old_logprobs are the sampling distribution's. advantages: (B,), broadcast over
    each response. A real token whose old or new log-prob is -inf (the engine's and the
    trainer's top-k / top-p masks disagree on it) says nothing about the ratio: it is left out
    of the loss and counted in `masked_tokens`.
    """
    real = mask > 0
    ok = real & torch.isfinite(logprobs) & torch.isfinite(old_logprobs)
    m = ok.to(logprobs.dtype)
    pg, clipped, log_ratio = _clipped_surrogate(logprobs, old_logprobs, advantages, ok, cfg)
    loss = masked_mean(pg, m)
    # approx_kl: to the sampler
    metrics = _surrogate_metrics(loss, clipped, log_ratio, m, real & ~ok)
    return _regularised(loss, metrics, logprobs, ok, mask, cfg, ref_logprobs, entropy)


def decoupled_policy_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The decoupled PPO objective (Fu et al. 2025, AReaL, arXiv 2505.24298, eq. 5): the trust
    region is around the proximal policy, the trainer's own log-probs of the samples under the
    weights the update starts from, not around the rollout engine's. Per token:

        w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))   (then the dual clip for A < 0)
        r = exp(logprobs - prox_logprobs)
        w = min(exp(prox_logprobs - behav_logprobs), behav_imp_cap)

    behav_logprobs are the engine's. w (atgrpo.algo.mismatch.truncated_weights, detached)
    corrects for the tokens having been drawn by the engine, while the clip bounds how far this
    update moves. It covers two gaps at once: samples drawn by older weights (asynchronous
    training, max_staleness > 0) and, on-policy too, the engine's kernels and precision, which
    score the same weights differently from the trainer (issue 59; then prox_logprobs are the
    trainer's behaviour log-probs).

    AReaL drops tokens whose w exceeds the cap (their loss is zeroed). Here w is capped instead
    (truncated importance sampling, as issue 23 asks): a token the sampler found much less likely
    than the trainer does still pushes, with a bounded weight, rather than vanishing from the
    update, so the cap trades a little bias for variance without silently discarding data.

    Shapes and masking as policy_loss; a real token where any of the three log-probs is -inf
    (e.g. outside the trainer's top-k/top-p support) is left out and counted in
    `masked_tokens`. prox_logprobs and behav_logprobs carry no gradient. Metrics: policy_loss's
    (approx_kl to the proximal policy) and `behav_approx_kl` (proximal to sampler),
    `behav_imp_weight_mean` and `behav_imp_weight_max` (of w before the cap, over the kept
    tokens), `behav_capped_fraction` (kept tokens whose w the cap lowered). With prox == behav,
    w = 1 and the loss and its gradient are policy_loss's.
    """
    prox_logprobs, behav_logprobs = prox_logprobs.detach(), behav_logprobs.detach()
    real = mask > 0
    ok = real & torch.isfinite(logprobs) & in_support(prox_logprobs, behav_logprobs)
    m = ok.to(logprobs.dtype)
    pg, clipped, log_ratio = _clipped_surrogate(logprobs, prox_logprobs, advantages, ok, cfg)
    behav_log_ratio = torch.clamp(
        _finite(prox_logprobs, ok) - _finite(behav_logprobs, ok), -LOG_RATIO_BOUND, LOG_RATIO_BOUND
    )
    weight = torch.exp(behav_log_ratio)  # before the cap, for the metrics
    w, capped = truncated_weights(prox_logprobs, behav_logprobs, ok, cfg.behav_imp_cap)
    loss = masked_mean(w.to(pg.dtype) * pg, m)
    metrics = _surrogate_metrics(loss, clipped, log_ratio, m, real & ~ok)
    metrics.update(
        behav_approx_kl=masked_mean(0.5 * behav_log_ratio**2, m).item(),
        behav_imp_weight_mean=masked_mean(weight, m).item(),
        behav_imp_weight_max=float(torch.where(ok, weight, torch.zeros_like(weight)).max())
        if ok.any()
        else 0.0,
        behav_capped_fraction=masked_mean(capped.to(m.dtype), m).item(),
    )
    return _regularised(loss, metrics, logprobs, ok, mask, cfg, ref_logprobs, entropy)


# ---- the registered forms (atgrpo.algo.registry; algorithm.policy_loss) ----------------------


@register_policy_loss("ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    prox_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """policy_loss (synchronous training: old_logprobs are the sampler's and the trainer's)."""
    return policy_loss(
        logprobs, old_logprobs, advantages, mask, cfg, ref_logprobs=ref_logprobs, entropy=entropy
    )


@register_policy_loss("decoupled", proximal=True)
def decoupled(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    prox_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """decoupled_policy_loss, old_logprobs being the engine's (behaviour) log-probs."""
    if prox_logprobs is None:
        raise ValueError(
            "the decoupled loss needs the trainer's proximal log-probs "
            "(max_staleness > 0 or behav_imp_cap > 0)"
        )
    return decoupled_policy_loss(
        logprobs,
        prox_logprobs,
        old_logprobs,
        advantages,
        mask,
        cfg,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )

"""The AT-GRPO policy loss: token-level clipped PPO surrogate with dual clip, token-mean
aggregation, optional KL to a frozen reference and entropy bonus (DESIGN.md §1; dual clip as in
Ye et al. 2020 and verl's compute_policy_loss)."""

from __future__ import annotations

import torch

from atgrpo.contract.trainer import LossConfig

# exp() of a log-ratio past ~88 overflows float32 and its gradient is NaN; verl clamps the
# log-ratio to +-20 before exp, where a clip has long taken over the token's loss anyway.
LOG_RATIO_BOUND = 20.0
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


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, cfg: LossConfig, *, ref_logprobs: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
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
    adv = advantages[:, None].to(logprobs.dtype)                                   # (B, 1)
    log_ratio = torch.clamp(_finite(logprobs, ok) - _finite(old_logprobs, ok), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    unclipped = -adv * ratio                                                         # (B, T)
    pg = torch.maximum(unclipped, -adv * clipped)
    # Dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at -c * A.
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip_c), pg)
    loss = masked_mean(pg, m)
    metrics = {
        "pg_loss": loss.item(),
        # Tokens whose loss a clip took over (no gradient), as verl and TRL count them: a ratio
        # outside the range on the side its advantage does not push to is not clipped.
        "clip_fraction": masked_mean((pg != unclipped).to(m.dtype), m).item(),
        "approx_kl": masked_mean(0.5 * log_ratio ** 2, m).item(),   # to the sampling policy
        "masked_tokens": float((real & ~ok).sum()),
    }
    if cfg.kl_coef and ref_logprobs is not None:
        ok_ref = ok & torch.isfinite(ref_logprobs)
        kl = masked_mean(kl_k3(_finite(logprobs, ok_ref), _finite(ref_logprobs, ok_ref)), ok_ref.to(m.dtype))
        loss = loss + cfg.kl_coef * kl
        metrics["kl_ref"] = kl.item()
    if entropy is not None:
        ent = masked_mean(entropy, mask.to(entropy.dtype))
        metrics["entropy"] = ent.item()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    metrics["loss"] = loss.item()
    return loss, metrics

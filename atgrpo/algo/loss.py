"""The AT-GRPO policy loss: token-level clipped PPO surrogate with dual clip, token-mean
aggregation, optional KL to a frozen reference and entropy bonus (DESIGN.md §1; dual clip as in
Ye et al. 2020 and verl's compute_policy_loss)."""

from __future__ import annotations

import torch

from atgrpo.contract.trainer import LossConfig


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean over every real token of the batch (not a mean of per-sequence means)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, cfg: LossConfig, *, ref_logprobs: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise and its diagnostics.

    logprobs, old_logprobs, mask, ref_logprobs, entropy: (B, T), response tokens only (mask 1 on
    real tokens); old_logprobs are the sampling distribution's. advantages: (B,), broadcast over
    each response.
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages[:, None].to(logprobs.dtype)                                   # (B, 1)
    log_ratio = logprobs - old_logprobs                                             # (B, T)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    unclipped = -adv * ratio                                                         # (B, T)
    pg = torch.maximum(unclipped, -adv * clipped)
    # Dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at -c * A.
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * cfg.dual_clip_c), pg)
    loss = masked_mean(pg, mask)
    metrics = {
        "pg_loss": loss.item(),
        # Tokens whose loss a clip took over (no gradient), as verl and TRL count them: a ratio
        # outside the range on the side its advantage does not push to is not clipped.
        "clip_fraction": masked_mean((pg != unclipped).to(mask.dtype), mask).item(),
        "approx_kl": masked_mean(0.5 * log_ratio ** 2, mask).item(),   # to the sampling policy
    }
    if cfg.kl_coef and ref_logprobs is not None:
        d = ref_logprobs - logprobs
        kl = masked_mean(torch.exp(d) - d - 1, mask)                    # k3, unbiased and >= 0
        loss = loss + cfg.kl_coef * kl
        metrics["ref_kl"] = kl.item()
    if entropy is not None:
        ent = masked_mean(entropy, mask)
        metrics["entropy"] = ent.item()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    metrics["loss"] = loss.item()
    return loss, metrics

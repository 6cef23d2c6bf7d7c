"""The rollout/training mismatch as pure functions: the truncated importance weight that corrects
the trainer's loss for tokens the rollout engine drew, and the figures that measure how far the
two disagree (issue 59).

The engine and the trainer score the same tokens with different kernels and precision (vLLM runs
pure bf16 and keeps exactly k tokens in top-k where the trainer keeps ties), so the engine's
log-probs are not the trainer's even at the same weights. The PPO ratio's old log-probs are
therefore the trainer's own (its behaviour log-probs: the weights that drew the samples, as the
trainer computes them), and the engine's enter only through a per-token weight

    w = min(exp(trainer_logp - engine_logp), cap)      (detached)

the truncated importance sampling correction (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"; Espeholt et al. 2018 truncate the same way). A token
the trainer's sampling transform excludes (trainer log-prob -inf: its top-k/top-p cut it) has no
ratio; it is left out of the loss and counted.
"""

from __future__ import annotations

import torch

from atgrpo.contract.trainer import MISMATCH_KEYS

__all__ = ["MISMATCH_KEYS"]  # the keys of mismatch_metrics, defined with the wire that carries them

# exp() of a log-ratio past ~88 overflows float32; as the loss does, bound it first (a weight of
# e^20 is capped long before it matters).
LOG_RATIO_BOUND = 20.0
# A weight counts as truncated when it is over the cap by more than this relative amount: with a
# cap of 1, an on-policy token's weight is 1 +- 1e-7, which the cap lowers by nothing worth
# counting.
CAP_TOLERANCE = 1e-5


def in_support(trainer_logp: torch.Tensor, engine_logp: torch.Tensor) -> torch.Tensor:
    """The tokens that have a ratio: both log-probs finite. (B, T) or flat, bool."""
    return torch.isfinite(trainer_logp) & torch.isfinite(engine_logp)


def behaviour_log_ratio(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, ok: torch.Tensor
) -> torch.Tensor:
    """log(trainer / engine) on the `ok` tokens, 0 elsewhere (never -inf or NaN), bounded."""
    zero = torch.zeros_like(trainer_logp)
    d = torch.where(ok, trainer_logp, zero) - torch.where(ok, engine_logp, zero)
    return torch.clamp(d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def truncated_weights(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, ok: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token importance weight min(exp(trainer - engine), cap), detached, and which
    tokens the cap lowered. Tokens outside `ok` get weight 0 (the caller masks them out too)."""
    raw = torch.exp(behaviour_log_ratio(trainer_logp.detach(), engine_logp.detach(), ok))
    w = torch.where(ok, torch.clamp(raw, max=cap), torch.zeros_like(raw))
    return w, ok & (raw > cap * (1 + CAP_TOLERANCE))


def quantiles(x: torch.Tensor, qs: tuple[float, ...]) -> list[float]:
    """Quantiles of a flat tensor with linear interpolation between order statistics (numpy's
    default), by sorting: torch.quantile refuses inputs over 2^24 elements, a large step's
    tokens. 0.0 each for an empty tensor."""
    if x.numel() == 0:
        return [0.0] * len(qs)
    s = torch.sort(x.double().flatten()).values
    out = []
    for q in qs:
        pos = q * (s.numel() - 1)
        lo = int(pos)
        hi = min(lo + 1, s.numel() - 1)
        out.append(float(s[lo] + (s[hi] - s[lo]) * (pos - lo)))
    return out


def mismatch_metrics(
    trainer_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float
) -> dict[str, float]:
    """How far the engine's log-probs are from the trainer's, over every response token of an
    update (flat tensors, one entry a token).

    mismatch_kl: the k3 estimate of KL(engine || trainer) per token, exp(d) - d - 1 with
    d = trainer - engine, averaged over the tokens in support (unbiased for tokens the engine
    sampled, >= 0; Schulman 2020). mismatch_outside_support: the fraction of all tokens whose
    trainer log-prob is -inf (the trainer's sampling transform cuts the token the engine drew).
    mismatch_ratio_p05/p50/p95: quantiles of exp(d) over the tokens in support.
    mismatch_capped_fraction: the fraction of tokens in support whose weight the cap lowered.
    """
    trainer_logp, engine_logp = trainer_logp.flatten().double(), engine_logp.flatten().double()
    ok = in_support(trainer_logp, engine_logp)
    n_ok = int(ok.sum())
    d = behaviour_log_ratio(trainer_logp, engine_logp, ok)[ok]
    ratio = torch.exp(d)
    p05, p50, p95 = quantiles(ratio, (0.05, 0.5, 0.95))
    capped = truncated_weights(trainer_logp, engine_logp, ok, cap)[1]
    total = max(trainer_logp.numel(), 1)
    return {
        "mismatch_kl": float((ratio - d - 1).sum()) / max(n_ok, 1),
        "mismatch_outside_support": float((trainer_logp == -torch.inf).sum()) / total,
        "mismatch_ratio_p05": p05,
        "mismatch_ratio_p50": p50,
        "mismatch_ratio_p95": p95,
        "mismatch_capped_fraction": float(capped.sum()) / max(n_ok, 1),
    }

"""The sampling transform, shared by the rollout engines and the trainer: the log-probs a sample
carries are exactly those of the distribution it was drawn from, and the trainer recomputes them
under the same transform (DESIGN.md §1; the reference recomputed them at temperature 1)."""

from __future__ import annotations

import torch

from atgrpo.contract.sampling import Sampling


def transform_logits(logits: torch.Tensor, sp: Sampling) -> torch.Tensor:
    """Logits of the distribution `sp` samples from: temperature, then top-k, then top-p.

    logits: (N, V) raw. Returns (N, V) with excluded tokens at -inf. Temperature 0 (greedy)
    leaves the logits as they are: greedy picks the argmax and reports raw log-probs.
    Top-k keeps the k largest and every token tied with the k-th; top-p then keeps the smallest
    prefix (largest first) whose mass reaches top_p, and every token tied with its last. Each is a
    threshold on the logits: tokens below it go.
    """
    if sp.temperature <= 0:
        return logits
    # At temperature 1 the logits as they are: dividing copies (N, V) for nothing.
    out = logits / sp.temperature if sp.temperature != 1.0 else logits
    if sp.top_k > 0 and sp.top_k < out.shape[-1]:
        top = torch.topk(out, sp.top_k, dim=-1).values  # (N, k), largest first
        kth = top[..., -1:]
        if sp.top_p < 1.0:
            # top-p over the top-k survivors only: k sorted values, no sort of the vocabulary. The
            # survivors' mass counts the tokens tied with the k-th beyond the k.
            ties = (out == kth).sum(-1, keepdim=True) - (top == kth).sum(-1, keepdim=True)
            logz = torch.logaddexp(
                torch.logsumexp(top, -1, keepdim=True), kth + ties.clamp(min=0).log()
            )
            kth = _top_p_threshold(top, logz, sp.top_p)
        return out.masked_fill(out < kth, float("-inf"))
    if sp.top_p < 1.0:
        ordered = torch.sort(out, descending=True, dim=-1).values  # (N, V)
        threshold = _top_p_threshold(ordered, torch.logsumexp(ordered, -1, keepdim=True), sp.top_p)
        out = out.masked_fill(out < threshold, float("-inf"))
    return out


def _top_p_threshold(ordered: torch.Tensor, logz: torch.Tensor, top_p: float) -> torch.Tensor:
    """(N, 1): the smallest logit top-p keeps, from logits sorted largest first (`ordered`, a
    prefix of the distribution's) and the log of the distribution's total mass (`logz`)."""
    probs = (ordered - logz).exp()
    ahead = probs.cumsum(-1) - probs  # the mass before each
    kept = (ahead < top_p).sum(-1, keepdim=True).clamp(min=1)  # the first always stays
    return ordered.gather(-1, kept - 1)


def sample_tokens(
    logits: torch.Tensor, s: Sampling, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; returns (tokens (N,), their log-probs (N,)) under the transform."""
    if s.temperature <= 0:
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        tokens = logprobs.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    # One softmax, and the drawn token's log from it: log_softmax and then exp passed over the
    # vocabulary twice (2.4 against 1.1 ms a decode step at 32 rows of 49,152; the log-probs
    # agree within 5e-7). A drawn token has mass, so its log is finite. Where the transform
    # changes nothing, the softmax reads 16-bit logits as they are: no float32 copy of them first.
    whole = s.temperature == 1.0 and not 0 < s.top_k < logits.shape[-1] and s.top_p >= 1.0
    if whole:
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        probs = torch.softmax(transform_logits(logits.float(), s), dim=-1)
    tokens = inverse_cdf(probs, generator)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


# The width of inverse_cdf's blocks: the within-block prefix sum runs over this many entries a row.
CDF_BLOCK = 256


def inverse_cdf(
    probs: torch.Tensor, generator: torch.Generator | None, block: int = CDF_BLOCK
) -> torch.Tensor:
    """One draw per row of `probs` (N, V): the first token whose cumulative mass exceeds a uniform.

    The same distribution as torch.multinomial at a tenth of its CPU cost: one random number per
    row, where multinomial draws one per vocabulary entry (3.9 ms against 0.4 ms for 64 rows of
    1,536). A token of probability 0 is never drawn. The prefix sums run in float64 so a 150k
    vocabulary's tail keeps its mass.

    In two levels, because a float64 prefix sum over the whole vocabulary does not vectorise on a
    CPU: 22 ms for 64 rows of SmolLM2's 49,152 (one thread, AMD EPYC), a fifth of a decode step.
    The vocabulary is cut into blocks of `block`; the uniform picks a block from the blocks'
    masses (a vectorised sum, then a prefix sum over V / block entries), then a token from that
    block's own prefix sum: the token the one-level search would pick, up to float rounding at a
    boundary (tests/algo/test_sampling.py holds the two to each other)."""
    n, v = probs.shape
    pad = (-v) % block
    padded = torch.nn.functional.pad(probs, (0, pad)) if pad else probs.contiguous()
    blocks = padded.view(n, -1, block)  # the padding's zeros are never drawn
    # A block's 256 entries summed in float32 (within ~1e-7 of its mass), the blocks' prefix sum in
    # float64: a float64 sum of every entry first writes a float64 copy of the whole vocabulary,
    # 4 ms a step at 32 rows, against 0.1 ms (measured in the engine's decode).
    mass = blocks.sum(-1).double()  # (N, B)
    cdf = mass.cumsum(-1)
    u = torch.rand((n, 1), generator=generator, dtype=torch.float64, device=probs.device)
    u = u * cdf[:, -1:]
    b = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[-1] - 1)  # (N, 1)
    within = u - (cdf.gather(-1, b) - mass.gather(-1, b))  # the mass to go inside block b
    rows = torch.arange(n, device=probs.device)
    inner = blocks[rows, b.squeeze(-1)].double().cumsum(-1)  # (N, block)
    j = torch.searchsorted(inner, within, right=True).clamp(max=block - 1)
    picks = (b * block + j).squeeze(-1)
    # Rounding at a block's edge (the block's sum against its own prefix sum) can land one past
    # its last token with mass, on a token of probability 0: those rows draw again by the
    # one-level search, which never lands there.
    missed = probs.gather(-1, picks.clamp(max=v - 1)[:, None]).squeeze(-1) <= 0
    if bool(missed.any()):
        picks[missed] = _one_level(probs[missed], generator)
    return picks.clamp(max=v - 1)


def _one_level(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """inverse_cdf in one prefix sum over the whole vocabulary (float64): exact, and slow."""
    cdf = probs.double().cumsum(dim=-1)  # (N, V)
    u = torch.rand(
        (probs.shape[0], 1), generator=generator, dtype=torch.float64, device=probs.device
    )
    picks = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return picks.clamp(max=probs.shape[-1] - 1)

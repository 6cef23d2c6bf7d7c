"""The chunked head's fused pass (trainer_svc/logprobs.py hidden_logprobs runs it on a plain
nn.Linear output layer): one autograd Function that runs the output layer, the sampling transform,
the log-softmax and the gather a pass of rows at a time, and whose backward adds the layer's weight
gradient straight into its .grad pass by pass, so no (N, V) logits and no second (V, H) gradient
exist. Apart from logprobs.py because it is the one place that writes its own backward: the
gradient formula, the dtypes it runs in and the .grad accumulation live together here.
"""

from __future__ import annotations

import contextlib

import torch

from atgrpo.algo.sampling import transform_logits
from atgrpo.contract.sampling import Sampling
from trainer_svc.sharding import HEAD_COMPUTE_DTYPE

# Vocabulary rows of the output layer's weight gradient added per product when it is float32 and
# the matmul runs in bf16 (atgrpo/memory.py counts one such slice).
HEAD_GRAD_ROWS = 8192


def _compute_dtype(device: torch.device, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output layer's matmul runs in: autocast's where it is on (what head(hidden)
    would do), else the weight's."""
    kind = device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _head_compute(head: torch.nn.Module, device: torch.device):
    """A head held in float32 whose matmuls run in bf16 (HEAD_COMPUTE_DTYPE: an FSDP pool's, so
    its gradient sums in float32) runs them as under autocast (_compute_dtype)."""
    dtype = getattr(head, HEAD_COMPUTE_DTYPE, None)
    if dtype is None or torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _pass_logp(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, sampling: Sampling
) -> torch.Tensor:
    """One pass: (n, H) hidden rows -> (n, V) float32 log-probs under the transform (-inf off its
    support)."""
    logits = h @ w.T if b is None else torch.addmm(b, h, w.T)
    return torch.log_softmax(transform_logits(logits.float(), sampling), dim=-1)


def _column_major(w: torch.Tensor) -> torch.Tensor:
    """`w` (V, H) laid out column-major where the backward's d(logits) @ w needs it: on a CPU, a
    16-bit product whose right operand is row-major takes a slow path (2048x1536 by 1536x256 in
    bf16: 756 ms against 45 ms column-major, as a Linear's forward passes its weight). The same
    values; one (V, H) copy per backward, on CPU only (a GPU's GEMM takes either layout)."""
    if w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float16):
        return w.t().contiguous().t()
    return w


def _grad_add(param: torch.Tensor, grad: torch.Tensor) -> None:
    """Adds to param.grad in place (allocating it the first time), as autograd's accumulation
    would."""
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    param.grad.add_(grad)


def _add_weight_grad(grad: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
    """grad += dz.T @ h. In place when the dtypes agree; a bf16 product into a float32 .grad goes
    HEAD_GRAD_ROWS vocabulary rows at a time, so no (V, H) product exists (Qwen3-8B's: 1.2 GiB)."""
    if grad.dtype == dz.dtype:
        grad.addmm_(dz.T, h)
        return
    for v0 in range(0, grad.shape[0], HEAD_GRAD_ROWS):
        grad[v0 : v0 + HEAD_GRAD_ROWS].add_(dz[:, v0 : v0 + HEAD_GRAD_ROWS].T @ h)


class _FusedHeadLogprobs(torch.autograd.Function):
    """Output layer + sampling transform + log-softmax + gather (+ entropy), a pass of `step`
    rows at a time, with no (N, V) tensor kept between passes.

    Forward: each pass's log-probs of the targets and entropies. Backward: each pass's log-probs
    again (recomputed, or kept when small: LOGPROB_KEEP_ELEMENTS), then d(logits) from the
    incoming gradients, exactly what autograd derives for the transform: with p the transformed
    distribution, lp = log p[target] and H = -sum p log p over its support,
        d(logits) = (g_lp (onehot(target) - p) - g_H p (log p + H)) / temperature
    on the support and 0 off it (top-k / top-p masks are piecewise constant; -inf logits carry no
    gradient), and 0 for a row whose target is outside the support (its log-prob is -inf; the loss
    leaves it out). The hidden rows' gradient is returned; the output layer's weight (and bias)
    gradient is added pass by pass straight into its .grad, so no second (V, H) buffer and no
    per-pass (V, H) gradients exist. (This is what autograd's accumulation into .grad does; the
    trainer sums .grad across ranks itself after the backward, _all_reduce_grads, and an FSDP model
    never takes this path: chunked_head_available.) A frozen output layer (LoRA) gets none.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, sampling, entropy, step, keep):
        cdt = _compute_dtype(hidden.device, weight)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cdt)
            b = None if bias is None else bias.to(cdt)
            n = hidden.shape[0]
            lp = torch.empty(n, device=hidden.device)
            ent = torch.zeros(n, device=hidden.device)
            kept = []
            for t0 in range(0, n, step):
                logp = _pass_logp(hidden[t0 : t0 + step].to(cdt), w, b, sampling)
                lp[t0 : t0 + step] = logp.gather(-1, targets[t0 : t0 + step, None]).squeeze(-1)
                if entropy != "none":
                    p = logp.exp()
                    # a scalar 0, not zeros_like: one (n, V) allocation and pass fewer
                    ent[t0 : t0 + step] = -(p * torch.where(p > 0, logp, 0.0)).sum(-1)
                    del p
                if keep:
                    kept.append(logp)
                del logp
        ctx.sampling, ctx.entropy, ctx.step, ctx.cdt = sampling, entropy, step, cdt
        ctx.kept = kept if keep else None
        ctx.weight, ctx.bias = weight, bias  # their .grad are written in the backward
        ctx.save_for_backward(hidden, weight, bias, targets, lp, ent)
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, _, _, targets, lp, ent = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        sampling, step, cdt = ctx.sampling, ctx.step, ctx.cdt
        want_w = weight.requires_grad
        want_b = bias is not None and bias.requires_grad
        want_h = ctx.needs_input_grad[0]
        n = hidden.shape[0]
        g_lp = torch.zeros(n, device=hidden.device) if g_lp is None else g_lp.float()
        # A target outside the support: log-prob -inf, no gradient (not -inf x 0 = NaN).
        g_lp = torch.where(torch.isfinite(lp), g_lp, torch.zeros_like(g_lp))
        g_ent = None if (ctx.entropy != "grad" or g_ent is None) else g_ent.float()
        scale = 1.0 / sampling.temperature if sampling.temperature > 0 else 1.0
        grad_h = torch.empty_like(hidden) if want_h else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cdt)
            b = None if bias is None else bias.to(cdt)
            if want_w and weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            w_h = _column_major(w) if want_h else None
            for i, t0 in enumerate(range(0, n, step)):
                t1 = min(t0 + step, n)
                h = hidden[t0:t1].to(cdt)
                logp = ctx.kept[i] if ctx.kept is not None else _pass_logp(h, w, b, sampling)
                p = logp.exp()
                g = g_lp[t0:t1, None]
                if g_ent is not None:
                    # d H / d log p = -p (log p + 1) on the support (0 off it), as autograd derives
                    # it
                    dlogp = torch.where(p > 0, logp, 0.0).add_(1).mul_(p).mul_(-g_ent[t0:t1, None])
                    dlogp.scatter_add_(-1, targets[t0:t1, None], g)
                    del logp
                    # log-softmax backward, then the temperature; p is 0 off the support, and so
                    # is dlogp.
                    dz = dlogp.sub_(p.mul_(dlogp.sum(-1, keepdim=True)))
                else:
                    # d log p is g at the target and 0 elsewhere, so its row sum is g and the
                    # log-softmax backward is onehot * g - p * g: the same numbers, bit for bit,
                    # without an (n, V) zeros, its row sum and a subtraction pass.
                    del logp
                    dz = p.mul_(-g).scatter_add_(-1, targets[t0:t1, None], g)
                del p
                if scale != 1.0:
                    dz.mul_(scale)
                dz = dz.to(cdt)
                if want_h:
                    grad_h[t0:t1] = (dz @ w_h).to(hidden.dtype)
                if want_w:
                    _add_weight_grad(weight.grad, dz, h)
                if want_b:
                    _grad_add(bias, dz.sum(0))
                del dz
        ctx.kept = None
        return grad_h, None, None, None, None, None, None, None


def _plain_linear(head: torch.nn.Module) -> bool:
    """An nn.Linear whose forward is its own (not an adapter-wrapped one): the fused pass
    applies."""
    return type(head) is torch.nn.Linear and not head._forward_hooks and not head._forward_pre_hooks

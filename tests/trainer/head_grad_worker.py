"""One rank of the head-gradient precision test (test_head_grad_precision.py):
`torchrun --nproc-per-node 2 head_grad_worker.py OUT`.

A Qwen3-shaped model (float32 masters, untied or tied head) sharded with FSDP2's bf16 mixed
precision; each rank scores its own hidden states through the fused head (hidden_logprobs, as a
forward of the root) and backpropagates a weighted sum of the log-probs. The head's gradient, summed
over the ranks by FSDP, is held against float64 autograd on the same weights and inputs: its
relative error (Frobenius norm), in one pass and in 34 passes, under shard()'s policy ("fp32": the
head gathered in float32, its matmuls in bf16) and under the previous one ("bf16": every group
gathered in bf16, so the gradient summed in bf16). Rank 0 writes the errors to OUT as JSON."""

import functools
import json
import os
import sys
import types

import torch
import torch.distributed as dist

from atgrpo.contract.sampling import Sampling
from trainer_svc.logprobs import hidden_logprobs
from trainer_svc.sharding import FORWARD_METHOD, _in_forward, host_state, shard, sharded_forward

HIDDEN, VOCAB, ROWS, PASS_ROWS, PASSES = 128, 2048, 2, 16, 34
TOKENS = PASS_ROWS * PASSES // ROWS  # (ROWS, TOKENS) positions: PASSES passes of PASS_ROWS


def build(tied: bool):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_hidden_layers=1,
        vocab_size=VOCAB,
        tie_word_embeddings=tied,
    )
    model = Qwen3ForCausalLM(cfg).float()
    torch.nn.init.normal_(
        model.get_output_embeddings().weight, std=HIDDEN**-0.5
    )  # logits ~ N(0, 1)
    return model


def shard_all_bf16(model) -> None:
    """The previous policy: every group, the root with the head included, gathered in bf16."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp import register_fsdp_forward_method as register

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    setattr(model, FORWARD_METHOD, types.MethodType(_in_forward, model))
    register(model, FORWARD_METHOD)
    model.set_gradient_divide_factor(1.0)
    model.set_force_sum_reduction_for_comms(True)
    for layer in model.model.layers:
        layer.set_gradient_divide_factor(1.0)
        layer.set_force_sum_reduction_for_comms(True)


def inputs(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    hidden = torch.randn(ROWS, TOKENS, HIDDEN, generator=g)
    targets = torch.randint(0, VOCAB, (ROWS, TOKENS), generator=g)
    weights = torch.rand(ROWS, TOKENS, generator=g)  # one sign: the passes add up, not cancel
    return hidden, targets, weights


def reference(weight: torch.Tensor, world: int) -> torch.Tensor:
    """d/dW of every rank's sum(weights * log p[target]), in float64 autograd from the bf16 weight
    and hidden states the matmuls take: what is left is the rounding of the products and sums."""
    w = weight.bfloat16().double().requires_grad_()
    for rank in range(world):
        hidden, targets, weights = inputs(rank)
        logp = torch.log_softmax(hidden.bfloat16().double() @ w.T, dim=-1)
        (logp.gather(-1, targets[..., None]).squeeze(-1) * weights).sum().backward()
    return w.grad


def error(policy: str, tied: bool, passes: int) -> float:
    model = build(tied)
    if policy == "fp32":
        shard(model, "cpu", mixed_bf16=True)
    else:
        shard_all_bf16(model)
    hidden, targets, weights = inputs(dist.get_rank())
    mask = torch.ones(ROWS, TOKENS)
    head = model.get_output_embeddings()
    score = functools.partial(
        hidden_logprobs, entropy="none", chunk_elements=VOCAB * ROWS * TOKENS // passes
    )
    samplings = {Sampling(temperature=1.0): list(range(ROWS))}
    lp, _ = sharded_forward(model, score, head, hidden.requires_grad_(), targets, mask, samplings)
    (lp * weights).sum().backward()
    grad = head.weight.grad.full_tensor()  # summed over the ranks (all-gather: both ranks)
    names = "model.embed_tokens.weight" if tied else "lm_head.weight"
    master = host_state(model, None).get(names)
    if dist.get_rank() != 0:
        return 0.0
    ref = reference(master, dist.get_world_size())
    return float((grad.double() - ref).norm() / ref.norm())


def main(out: str) -> None:
    dist.init_process_group("gloo")
    got = {
        f"{policy}-{'tied' if tied else 'untied'}-{passes}": error(policy, tied, passes)
        for policy in ("bf16", "fp32")
        for tied in (False, True)
        for passes in (1, PASSES)
    }
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(got, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown of gloo (dist_worker.py)

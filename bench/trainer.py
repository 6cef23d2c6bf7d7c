"""Trainer throughput: one update on the same samples with atgrpo's update against TRL's
GRPOTrainer update (its own _compute_loss, backward, gradient clipping and optimizer step), on
the tiny and small models, in one run. Prints tokens/s and the ratio (target: >= 1.0x TRL).
Then the output layer at Qwen3's vocabulary: the update through the chunked head against the
same update through the model's full logits.

    python bench/trainer.py [--samples 16] [--prompt 32] [--response 128] [--repeats 5]
                            [--sizes tiny,small]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import parse_args, record  # noqa: E402

from atgrpo.contract.sampling import Sampling  # noqa: E402
from atgrpo.contract.trainer import TrainSample, UpdateConfig  # noqa: E402
from atgrpo.models import build_tiny_model  # noqa: E402
from trainer_svc.update import update  # noqa: E402
from trainer_svc.update_context import TrainerUpdateSettings


def batch(args, vocab=1500):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randint(3, vocab, (args.samples, args.prompt), generator=g),
        torch.randint(3, vocab, (args.samples, args.response), generator=g),
        torch.randn(args.samples, generator=g),
    )


def trl_rate(model_dir: str, args, bf16: bool) -> float:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    prompts, responses, adv = batch(args)
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.samples,
        num_generations=8,
        max_completion_length=args.response,
        learning_rate=1e-5,
        loss_type="bnpo",
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=10**6,
        bf16=bf16,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=cfg,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=Dataset.from_dict({"prompt": ["x"] * args.samples}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(), which this bypasses
    optimizer = trainer.create_optimizer()
    inputs = {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_ids": responses,
        "completion_mask": torch.ones_like(responses),
        "advantages": adv,
        # Old log-probs as a fixed tensor, as a rollout engine would hand them over.
        "old_per_token_logps": torch.full(responses.shape, -7.0),
        "num_items_in_batch": torch.tensor(float(responses.numel())),
    }

    def step():
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()

    return _rate(step, responses.numel(), args.repeats)


def atgrpo_rate(model_dir: str, args, bf16: bool) -> float:
    from transformers import AutoModelForCausalLM

    prompts, responses, adv = batch(args)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    samples = [
        TrainSample(
            "a",
            prompts[i].tolist(),
            responses[i].tolist(),
            [-7.0] * args.response,
            float(adv[i]),
            Sampling(temperature=1.0),
        )
        for i in range(args.samples)
    ]
    cfg = UpdateConfig(mini_batch_size=args.samples)
    settings = TrainerUpdateSettings(
        micro_batch_tokens=args.samples * (args.prompt + args.response), autocast_bf16=bf16
    )
    return _rate(
        lambda: update(model, optimizer, samples, cfg, params=params, settings=settings),
        responses.numel(),
        args.repeats,
    )


# A small decoder under Qwen3's vocabulary: the output layer and the log-prob path are most of the
# work, as they are in a real model's update at long responses.
REAL_VOCAB = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 151_936,
    "model_type": "qwen3",
}


def head_rates(args) -> tuple[float, float]:
    """Update tokens/s through the chunked (fused) output layer and through the full logits, the
    GPU examples' transform (top-k 20, top-p 0.9), float32, on the same model and samples."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer_svc import logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**REAL_VOCAB))
    prompts, responses, adv = batch(args, vocab=REAL_VOCAB["vocab_size"])
    sampling = Sampling(temperature=1.0, top_k=20, top_p=0.9)
    samples = [
        TrainSample(
            "a",
            prompts[i].tolist(),
            responses[i].tolist(),
            [-7.0] * args.response,
            float(adv[i]),
            sampling,
        )
        for i in range(args.samples)
    ]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.0)  # the weights stay: both paths see the same model
    cfg = UpdateConfig(mini_batch_size=args.samples)
    settings = TrainerUpdateSettings(args.samples * (args.prompt + args.response))
    chunked = _rate(
        lambda: update(model, optimizer, samples, cfg, params=params, settings=settings),
        responses.numel(),
        args.repeats,
    )
    available = logprobs.chunked_head_available
    logprobs.chunked_head_available = lambda m: False  # the baseline: the model's own full logits
    try:
        full = _rate(
            lambda: update(model, optimizer, samples, cfg, params=params, settings=settings),
            responses.numel(),
            args.repeats,
        )
    finally:
        logprobs.chunked_head_available = available
    return chunked, full


def _rate(step, tokens: int, repeats: int) -> float:
    step()  # warm-up
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        best = max(best, tokens / (time.perf_counter() - t))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="tiny,small", help="models to compare on, comma-separated")
    args = parse_args(
        ap, smoke={"samples": 8, "prompt": 8, "response": 8, "repeats": 1, "sizes": "tiny"}
    )
    print(
        f"one update of {args.samples} samples x ({args.prompt} prompt + {args.response} response) "
        f"tokens, CPU"
    )
    print(f"{'model':<7} {'precision':<10} {'TRL tok/s':>10} {'atgrpo tok/s':>13} {'ratio':>7}")
    for size in args.sizes.split(","):
        model_dir = str(build_tiny_model(Path(tempfile.mkdtemp()) / size, size=size))
        for bf16 in (False, True):  # TRL defaults to bf16 autocast on CPU: compare like with like
            trl, ours = trl_rate(model_dir, args, bf16), atgrpo_rate(model_dir, args, bf16)
            print(
                f"{size:<7} {'bf16 mixed' if bf16 else 'float32':<10} {trl:10.0f} {ours:13.0f} "
                f"{ours / trl:6.2f}x"
            )
            precision = "bf16 mixed" if bf16 else "float32"
            record(
                "trainer",
                f"update tok/s vs TRL GRPO, {size} {precision}",
                ours / trl,
                f"{ours:.0f} vs {trl:.0f} tok/s",
            )
    chunked, full = head_rates(args)
    print(
        f"Qwen3's vocabulary (151,936), top-k 20 / top-p 0.9: chunked head {chunked:.0f} tok/s, "
        f"full logits {full:.0f} tok/s, {chunked / full:.2f}x"
    )
    record(
        "trainer",
        "update tok/s, chunked head vs full logits, 151,936 vocab",
        chunked / full,
        f"{chunked:.0f} vs {full:.0f} tok/s",
    )


if __name__ == "__main__":
    main()

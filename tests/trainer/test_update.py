"""The AT-GRPO update on the tiny model: parameters move, micro-batching does not change the
result, LoRA updates only the trained agent's adapter, and bad samples are refused whole."""

import copy
import dataclasses
import math

import pytest
import torch

from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import TrainSample, UpdateConfig
from atgrpo.errors import InvalidArgument
from trainer_svc.packing import pack
from trainer_svc.update import response_logprobs, update, validate
from trainer_svc.update_context import TrainerUpdateSettings

S = Sampling(temperature=0.7)  # random test tokens must stay inside the support (no top-k/top-p)


def load(model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def on_policy_samples(model, n=8, agents=("a",), seed=0):
    """Samples whose old log-probs are the model's own (ratio 1 at the first step)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, 1500, (5 + i % 3,), generator=g).tolist()
        response = torch.randint(3, 1500, (3 + i % 4,), generator=g).tolist()
        out.append(
            TrainSample(
                agents[i % len(agents)],
                prompt,
                response,
                [0.0] * len(response),
                float(torch.randn(1, generator=g)),
                S,
            )
        )
    with torch.no_grad():
        lp, _, mask = response_logprobs(model, out, "cpu")
    return [
        TrainSample(
            s.agent,
            s.prompt_ids,
            s.response_ids,
            lp[i, : len(s.response_ids)].tolist(),
            s.advantage,
            S,
        )
        for i, s in enumerate(out)
    ]


TRAINER_KEYS = {f.name for f in dataclasses.fields(TrainerUpdateSettings)}


def split(**kw) -> dict:
    """update()'s cfg and settings from one set of keywords: the trainer's own keys go to
    settings, the rest to the router's UpdateConfig."""
    own = {k: kw.pop(k) for k in TRAINER_KEYS & kw.keys()}
    return {"cfg": UpdateConfig(**kw), "settings": TrainerUpdateSettings(**own)}


def run_update(model, samples, optimizer=torch.optim.AdamW, **cfg):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params, lr=1e-3)
    return update(
        model,
        opt,
        samples,
        **split(**cfg),
        params=params,
        generator=torch.Generator().manual_seed(1),
    )


def test_parameters_change_and_the_on_policy_loss_is_minus_the_token_mean_advantage(tiny_model):
    model = load(tiny_model)
    before = copy.deepcopy(model.state_dict())
    samples = on_policy_samples(model)
    metrics = run_update(model, samples, mini_batch_size=8)
    tokens = sum(len(s.response_ids) for s in samples)
    want = -sum(s.advantage * len(s.response_ids) for s in samples) / tokens
    assert metrics["loss"] == pytest.approx(want, abs=1e-5)
    assert metrics["clip_fraction"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-10)
    assert metrics["optimizer_steps"] == 1 and math.isfinite(metrics["grad_norm"])
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before) - sum("rotary" in k for k in before)


def test_micro_batching_is_equivalent(tiny_model):
    # SGD, so that the parameters' change is the gradient itself: Adam's normalisation would blow
    # float summation-order noise on near-zero gradients up to a visible difference.
    results = []
    for budget in (10_000, 1):  # 1 x 8 (one micro-batch) vs 8 x 1 (one sample each)
        model = load(tiny_model)
        samples = on_policy_samples(model)
        assert len(pack(range(8), samples, budget)) == (1 if budget > 100 else 8)
        run_update(
            model, samples, optimizer=torch.optim.SGD, mini_batch_size=8, micro_batch_tokens=budget
        )
        results.append(model.state_dict())
    for k in results[0]:
        assert torch.allclose(results[0][k], results[1][k], atol=1e-8, rtol=1e-5), k


def test_epochs_and_mini_batches_give_that_many_optimizer_steps(tiny_model):
    model = load(tiny_model)
    metrics = run_update(model, on_policy_samples(model), mini_batch_size=3, epochs=2)
    assert metrics["optimizer_steps"] == 2 * 3


def test_lora_updates_only_the_trained_agents_adapter(tiny_model):
    from peft import LoraConfig, get_peft_model

    model = load(tiny_model)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(model, cfg, adapter_name="tool")
    model.add_adapter("plan", cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def adapter(agent):
        model.set_adapter(agent)
        # set_adapter re-enables grads of that adapter only
        for (
            name,
            p,
        ) in model.named_parameters():
            p.requires_grad = f".{agent}." in name and "lora_" in name
        return torch.enable_grad()

    samples = on_policy_samples(model, agents=("plan",))
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    opt = torch.optim.AdamW(params, lr=1e-2)
    update(model, opt, samples, UpdateConfig(mini_batch_size=8), params=params, adapter=adapter)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".plan." in k and "lora_" in k for k in changed)
    # base bitwise equal
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(response_ids=[]), "empty response"),
        (dict(old_logprobs=[0.0]), "3 response tokens but 1 log-probs"),
        (dict(advantage=float("nan")), "advantage nan is not finite"),
        (dict(old_logprobs=[0.0, float("inf"), 0.0]), "NaN or +inf"),
        (dict(old_logprobs=[0.0, float("nan"), 0.0]), "NaN or +inf"),
        (dict(agent="zed"), "this pool trains ['a'], not 'zed'"),
    ],
)
def test_bad_samples_are_refused_naming_the_sample(bad, message):
    good = dict(
        agent="a", prompt_ids=[1, 2], response_ids=[3, 4, 5], old_logprobs=[-1.0] * 3, advantage=0.5
    )
    samples = [TrainSample(**good), TrainSample(**{**good, **bad})]
    with pytest.raises(InvalidArgument, match="sample 1") as err:
        validate(samples, ["a"])
    assert message in err.value.message
    validate([TrainSample(**good)], ["a"])


def test_learning_rate_schedule_warms_up_then_decays_to_the_floor():
    from trainer_svc.state import lr_factor

    f = [lr_factor(s, warmup=4, total=14, min_ratio=0.3) for s in range(16)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4] == pytest.approx(1.0) and f[9] == pytest.approx(0.3 + 0.7 * 0.5)
    assert f[14] == pytest.approx(0.3) and f[15] == pytest.approx(0.3)
    assert all(a >= b for a, b in zip(f[4:], f[5:], strict=False))

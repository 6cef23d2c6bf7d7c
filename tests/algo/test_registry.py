"""A new advantage estimator and a new policy loss, each registered in this one file, train a toy
step by their config names; the built-ins are found the same way; unknown names are refused with
the known ones listed."""

import copy
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from atgrpo.algo.loss import masked_mean
from atgrpo.algo.registry import (
    Estimate,
    adv_estimator,
    estimator_names,
    loss_names,
    policy_loss_named,
    register_adv_est,
    register_policy_loss,
)
from atgrpo.config import ConfigError, parse_config
from atgrpo.contract.rollout import PolicyRef, Sample
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig, UpdateConfig
from router_svc.steps import step_batches
from tests.trainer.test_update import load, on_policy_samples
from trainer_svc.update import update

ROOT = Path(__file__).resolve().parents[2]


@register_adv_est("test_rank")
def rank_within_task(samples, rewards, *, norm_std):
    """Each task's samples ranked by reward, centred: -1 .. +1 (no std)."""
    groups = torch.tensor([int(s.task_id[1:]) for s in samples])
    adv = torch.zeros_like(rewards, dtype=torch.float)
    for g in groups.unique():
        idx = (groups == g).nonzero().flatten()
        order = rewards[idx].argsort().argsort().float()
        adv[idx] = 2 * order / max(1, len(idx) - 1) - 1 if len(idx) > 1 else 0.0
    return Estimate(adv, torch.zeros_like(rewards, dtype=torch.bool), groups)


@register_policy_loss("test_reinforce")
def reinforce(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    cfg,
    *,
    prox_logprobs=None,
    ref_logprobs=None,
    entropy=None,
):
    """Plain REINFORCE: -A log p, token-mean."""
    m = mask.to(logprobs.dtype)
    loss = masked_mean(-advantages[:, None] * torch.where(mask > 0, logprobs, 0.0), m)
    return loss, {"loss": loss.item(), "masked_tokens": 0.0}


def sample(task, reward, branch):
    return Sample(
        task,
        "a",
        0,
        branch,
        PolicyRef("p"),
        [5, 6, 7],
        [8, 9],
        [-0.1, -0.2],
        reward,
        0.0,
        False,
        False,
        branch == 0,
        Sampling(temperature=0.7),
        episode=1,
    )


def test_a_registered_estimator_groups_and_scores_a_step():
    samples = [sample("t0", r, b) for b, r in enumerate((0.0, 2.0, 1.0))] + [
        sample("t1", 5.0, 0),
        sample("t1", 3.0, 1),
    ]
    out = step_batches(samples, {"a": "p"}, grouping="test_rank")
    assert out.advantages == pytest.approx([-1.0, 1.0, 0.0, 1.0, -1.0])
    assert out.agents["a"].groups == 2
    assert adv_estimator("test_rank").collect == "tree"


def test_a_registered_estimator_and_loss_train_a_toy_step(tiny_model):
    model = load(tiny_model)
    before = copy.deepcopy(model.state_dict())
    train = on_policy_samples(model, n=4)
    # The router's side: its advantages come from the new estimator ...
    rollout = [sample(f"t{i // 2}", float(i), i % 2) for i in range(4)]
    batches = step_batches(rollout, {"a": "p"}, grouping="test_rank")
    train = [replace(s, advantage=a) for s, a in zip(train, batches.advantages, strict=True)]
    # ... and the trainer's side trains with the new loss, by its name.
    params = [p for p in model.parameters() if p.requires_grad]
    metrics = update(
        model,
        torch.optim.AdamW(params, lr=1e-3),
        train,
        UpdateConfig(LossConfig(policy_loss="test_reinforce"), mini_batch_size=4),
        params=params,
    )
    tokens = sum(len(s.response_ids) for s in train)
    want = (
        -sum(a * sum(s.old_logprobs) for s, a in zip(train, batches.advantages, strict=True))
        / tokens
    )
    assert metrics["loss"] == pytest.approx(want, abs=1e-4)  # -A log p at the starting weights
    assert metrics["optimizer_steps"] == 1
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_built_ins_are_registered():
    assert {"turn", "trajectory", "turn_loo", "task", "task_agent", "task_turn"} <= set(
        estimator_names()
    )
    assert {"ppo_clip", "decoupled"} <= set(loss_names())
    assert adv_estimator("trajectory").collect == "trajectory"


def config(**algorithm):
    return {
        "run": {"name": "r"},
        "env": {"name": "toy", "turn_order": ["a"]},
        "pools": {"p": {"model_path": "/m"}},
        "agents": {"a": {"pool": "p"}},
        "algorithm": algorithm,
    }


def test_config_names_are_checked_against_the_registries():
    assert (
        parse_config(config(grouping="test_rank", policy_loss="test_reinforce")).algorithm.grouping
        == "test_rank"
    )
    with pytest.raises(ConfigError) as err:
        parse_config(config(grouping="ranked", policy_loss="reinforce"))
    text = str(err.value)
    assert "algorithm.grouping: 'ranked' must be one of" in text and "'trajectory'" in text
    assert "Did you mean 'test_reinforce'?" in text and "@register_policy_loss('reinforce')" in text


def test_asynchronous_training_picks_the_decoupled_form_and_refuses_a_loss_without_it():
    assert parse_config(config(max_staleness=2)).update_for("p").policy_loss == "decoupled"
    # On-policy too by default: the ratio sits on the trainer's own log-probs (issue 59); only
    # with the correction off is it the plain ppo_clip on the engine's.
    assert parse_config(config()).update_for("p").policy_loss == "decoupled"
    assert parse_config(config(behav_imp_cap=0)).update_for("p").policy_loss == "ppo_clip"
    with pytest.raises(ConfigError, match="proximal"):
        parse_config(config(max_staleness=1, policy_loss="test_reinforce"))


def test_an_estimator_of_the_wrong_shape_is_refused_with_what_it_must_return():
    @register_adv_est("test_short")
    def short(samples, rewards, *, norm_std):
        return Estimate(
            rewards[:1].float(), torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
        )

    with pytest.raises(ValueError, match=r"\(B,\) tensors"):
        step_batches(
            [sample("t0", 1.0, 0), sample("t0", 0.0, 1)], {"a": "p"}, grouping="test_short"
        )
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("test_rank")(short)


def test_a_config_names_and_checks_the_built_ins_without_importing_torch():
    # The router and the CLI start without torch (pyproject.toml): the registry knows each
    # built-in's name and what a config check reads of it (collect, proximal) from a table, and
    # imports the function on its first call.
    probe = (
        "import sys\n"
        "from atgrpo.config import load_config\n"
        "cfg = load_config('examples/toy_L1_tiny.yaml')\n"
        "from atgrpo.algo import registry\n"
        "print(registry.adv_estimator('trajectory').collect,"
        " registry.policy_loss_named('decoupled').proximal, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["trajectory", "True", "False"]


def test_the_table_of_built_ins_agrees_with_their_registration():
    import atgrpo.algo.estimators  # noqa: F401  (registers the real functions in the table's place)
    import atgrpo.algo.loss  # noqa: F401

    assert adv_estimator("turn").fn.__name__ == "at_grpo"
    assert adv_estimator("task_turn").fn.__name__ == "by_task_turn"
    assert adv_estimator("trajectory").collect == "trajectory"
    assert policy_loss_named("ppo_clip").proximal is False
    assert policy_loss_named("decoupled").proximal is True
    # a registration that disagrees with the table is refused, not silently taken
    with pytest.raises(ValueError, match="unlike atgrpo.algo.registry's table"):
        register_adv_est("trajectory")(atgrpo.algo.estimators.trajectory_grpo)

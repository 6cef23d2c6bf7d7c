"""The run config: the example loads and round-trips; every bad input gets a field and a fix."""

from __future__ import annotations

import copy
import pickle

import pytest
import yaml

from atgrpo.config import (
    ConfigError,
    LoraConfig,
    RunConfig,
    dump_config,
    load_config,
    parse_config,
)
from atgrpo.contract.sampling import Sampling
from atgrpo.contract.trainer import LossConfig, UpdateConfig
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "plan_path_L1_tiny.yaml"
DELETE = object()
ADDRESSES = {
    "env": "localhost:50051",
    "sandbox": "localhost:50052",
    "router": "localhost:50053",
    "rollout": {"shared": ["localhost:50054", "10.0.0.2:50054"]},
    "trainer": {"shared": "trainer-shared.atgrpo.svc:50055"},
}


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def edited(edits: dict[str, object]) -> dict:
    """The example with dotted paths set (or removed with DELETE)."""
    data = copy.deepcopy(example())
    for dotted, value in edits.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[last]
        else:
            node[last] = copy.deepcopy(value)
    return data


def errors_of(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value


# ---- valid configs ---------------------------------------------------------------------------


def test_example_loads_with_its_values_and_defaults():
    cfg = load_config(EXAMPLE)
    assert cfg.level == "L1"
    assert cfg.local_mode
    assert cfg.run.run_dir == "runs/plan-path-l1-tiny"  # empty run_dir -> runs/<name>
    assert cfg.agents_of("shared") == ["tool", "plan"]
    assert cfg.pools["shared"].optim.lr == pytest.approx(1e-5)
    assert cfg.pools["shared"].optim.betas == (0.9, 0.999)  # untouched optim keys keep defaults
    tool = cfg.agents["tool"]
    # a partial eval_sampling block overrides only what it names: eval stays greedy
    assert (tool.eval_sampling.temperature, tool.eval_sampling.max_tokens) == (0.0, 64)
    assert tool.train_sampling.temperature == 1.0


def test_example_round_trips_through_dict_and_yaml(tmp_path):
    cfg = load_config(EXAMPLE)
    assert parse_config(cfg.to_dict()) == cfg
    path = tmp_path / "dumped.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
    assert dump_config(load_config(path)) == dump_config(cfg)


def level_variant(level: str) -> dict:
    if level == "L0":
        return edited({"env.turn_order": ["plan"], "agents.tool": DELETE})
    if level == "L1":
        return example()
    if level == "L2":
        return edited({"pools.shared.specialization": "lora"})
    return edited(
        {  # L3: three agents on two pools
            "env.turn_order": ["tool", "plan", "critic"],
            "agents.critic": {"pool": "big"},
            "pools.big": {"model_path": "/models/big", "engine": "vllm", "device": "cuda"},
        }
    )


@pytest.mark.parametrize("level", ["L0", "L1", "L2", "L3"])
def test_level_follows_agents_and_pools(level):
    cfg = parse_config(level_variant(level))
    assert cfg.level == level
    assert parse_config(cfg.to_dict()) == cfg


def test_lora_pool_gets_default_adapter_settings_and_l3_agents_of():
    assert parse_config(level_variant("L2")).pools["shared"].lora == LoraConfig()
    l3 = parse_config(level_variant("L3"))
    assert (l3.agents_of("shared"), l3.agents_of("big")) == (["tool", "plan"], ["critic"])


def test_ints_and_exponent_strings_are_floats_and_options_are_free_form():
    # PyYAML reads a bare `1e-6` as a string; it still means a number here
    cfg = parse_config(
        edited(
            {
                "algorithm.alpha": 2,
                "pools.shared.optim.lr": "1e-6",
                "env.options": {"hint": None, "sizes": [4, 6]},
            }
        )
    )
    assert cfg.env.options == {"hint": None, "sizes": [4, 6]}  # free-form, passed through
    assert cfg.algorithm.alpha == 2.0 and isinstance(cfg.algorithm.alpha, float)
    assert cfg.pools["shared"].optim.lr == pytest.approx(1e-6)


def test_full_service_addresses_and_frozen_pool_without_trainer():
    data = edited(
        {
            "services": ADDRESSES,
            # vllm-cpu is a valid engine/device pair
            "pools.judge": {
                "model_path": "/m/judge",
                "trainable": False,
                "engine": "vllm",
                "device": "cpu",
            },
            "agents.critic": {"pool": "judge"},
            "env.turn_order": ["tool", "plan", "critic"],
            "services.rollout.judge": ["[::1]:6000"],
        }
    )
    cfg = parse_config(data)
    assert not cfg.local_mode
    assert cfg.services.rollout["shared"] == ("localhost:50054", "10.0.0.2:50054")
    assert "judge" not in cfg.services.trainer  # a frozen pool needs no trainer


def test_with_overrides_revalidates_and_leaves_the_original():
    cfg = load_config(EXAMPLE)
    new = cfg.with_overrides(steps=3, run_dir="/tmp/r")
    assert (new.run.steps, new.run.run_dir) == (3, "/tmp/r")
    assert cfg.run.steps == 20 and new.pools == cfg.pools
    with pytest.raises(ConfigError) as info:
        cfg.with_overrides(steps=0)
    assert info.value.field == "run.steps" and "1 or more" in str(info.value)


def test_grouping_defaults_to_turn_and_takes_trajectory():
    assert parse_config(example()).algorithm.grouping == "turn"
    assert (
        parse_config(edited({"algorithm.grouping": "trajectory"})).algorithm.grouping
        == "trajectory"
    )


def test_parallel_credit_defaults_to_paired_and_all_pairs_needs_parallel_turns():
    assert parse_config(example()).algorithm.parallel_credit == "paired"
    both = {"algorithm.parallel_credit": "all_pairs", "env.parallel": True}
    assert parse_config(edited(both)).algorithm.parallel_credit == "all_pairs"
    err = str(errors_of(edited({"algorithm.parallel_credit": "all_pairs"})))
    assert "algorithm.parallel_credit" in err and "set env.parallel: true" in err
    assert "algorithm.parallel_credit" in str(errors_of(edited({"algorithm.parallel_credit": "x"})))


def test_a_run_is_asynchronous_when_a_trainable_pool_allows_stale_samples():
    assert not parse_config(example()).asynchronous  # default 0
    assert parse_config(edited({"algorithm.max_staleness": 1})).asynchronous
    # a pool's own bound
    assert parse_config(edited({"pools.shared.max_staleness": 2})).asynchronous
    # The pool's own 0 overrides the run's 1: no pool may lag, so the loop stays synchronous.
    assert not parse_config(
        edited({"algorithm.max_staleness": 1, "pools.shared.max_staleness": 0})
    ).asynchronous
    assert parse_config(example()).pool_of == {"tool": "shared", "plan": "shared"}


def test_the_update_settings_are_the_contracts_own_types_written_flat_and_sent_as_they_are():
    edits = {"algorithm.kl_coef": 0.05, "algorithm.clip_eps_high": 0.28, "algorithm.epochs": 2}
    edits |= {"algorithm.max_staleness": 1, "pools.shared.max_staleness": 3}
    cfg = parse_config(edited(edits))
    update, loss = cfg.algorithm.update, cfg.algorithm.update.loss
    assert type(update) is UpdateConfig and type(loss) is LossConfig
    assert (loss.kl_coef, loss.clip_eps_high, loss.clip_eps_low) == (0.05, 0.28, 0.2)
    assert update.epochs == 2
    written = cfg.to_dict()["algorithm"]
    assert written["kl_coef"] == 0.05 and written["max_staleness"] == 1
    assert not {"update", "loss", "micro_batch_tokens", "grad_clip"} & set(written)
    sent = cfg.update_for("shared")
    assert sent.loss is loss and (sent.epochs, sent.max_staleness) == (2, 3)  # the pool's own bound
    assert sent.policy_loss == "decoupled"  # ppo_clip's form for stale samples
    assert errors_of(edited({"algorithm.loss": {"kl_coef": 0.1}})).field == "algorithm.loss"
    # a pool's
    assert errors_of(edited({"algorithm.grad_clip": 0.5})).field == "algorithm.grad_clip"
    assert "Did you mean 'kl_coef'?" in errors_of(edited({"algorithm.kl_coef_": 0.1})).message


def test_behav_imp_cap_defaults_to_2_and_0_turns_the_correction_off():
    on = parse_config(example()).update_for("shared")
    assert on.loss.behav_imp_cap == 2.0 and on.trainer_logprobs and on.policy_loss == "decoupled"
    off = parse_config(edited({"algorithm.behav_imp_cap": 0})).update_for("shared")
    assert off.loss.behav_imp_cap == 0.0 and not off.trainer_logprobs
    assert off.policy_loss == "ppo_clip"  # the ratio on the engine's log-probs, as before


def test_sampling_is_the_contracts_type_and_a_request_seed_is_no_config_key():
    tool = parse_config(example()).agents["tool"]
    assert type(tool.train_sampling) is Sampling and tool.eval_sampling.temperature == 0.0
    assert "seed" not in load_config(EXAMPLE).to_dict()["agents"]["tool"]["train_sampling"]
    err = errors_of(edited({"agents.tool.train_sampling.seed": 3}))
    assert err.field == "agents.tool.train_sampling.seed" and "unknown key" in err.message


# ---- invalid configs: every rule names its field and a fix -------------------------------------

# (case id, edits of the example, expected .field, fragment of the message)
BAD = [
    ("unknown-key", {"run.stpes": 5}, "run.stpes", "Did you mean 'steps'?"),
    ("unknown-section", {"algoritm": {"k": 2}}, "algoritm", "Did you mean 'algorithm'?"),
    ("unknown-key-no-match", {"agents.tool.zzz": 1}, "agents.tool.zzz", "Valid keys: pool"),
    ("wrong-type-int", {"run.steps": "abc"}, "run.steps", "expected an integer, got 'abc'"),
    ("bool-for-int", {"algorithm.k": True}, "algorithm.k", "expected an integer, got true"),
    ("float-for-int", {"run.tasks_per_step": 2.5}, "run.tasks_per_step", "whole number"),
    ("wrong-type-float", {"algorithm.alpha": "high"}, "algorithm.alpha", "expected a number"),
    ("bool-for-float", {"algorithm.alpha": False}, "algorithm.alpha", "expected a number"),
    ("str-for-list", {"env.turn_order": "tool"}, "env.turn_order", "expected a list"),
    ("choice-typo", {"pools.shared.engine": "vlm"}, "pools.shared.engine", "Did you mean 'vllm'?"),
    (
        "hub-url",
        {"pools.shared.model_path": "https://huggingface.co/Qwen/Qwen3-0.6B"},
        "pools.shared.model_path",
        "atgrpo model tiny --out DIR",
    ),
    (
        "hf-url",
        {"pools.shared.model_path": "hf://Qwen/Qwen3-0.6B"},
        "pools.shared.model_path",
        "no model hub is reachable",
    ),
    (
        "missing-field",
        {"pools.shared.model_path": DELETE},
        "pools.shared.model_path",
        "Add `model_path:` under `pools.shared:`",
    ),
    ("missing-section", {"env": DELETE}, "env", "Add `env:` at the top level"),
    (
        "null-value",
        {"pools.shared.optim": None},
        "pools.shared.optim",
        "remove the key to use the default",
    ),
    ("null-required", {"run.name": None}, "run.name", "(this field is required)"),
    ("section-not-mapping", {"algorithm": [1, 2]}, "algorithm", "`key: value`"),
    ("bad-run-name", {"run.name": "My Run"}, "run.name", "Try 'my-run'"),
    (
        "turn-order-unknown-agent",
        {"env.turn_order": ["tool", "plan", "critc"]},
        "env.turn_order[2]",
        "Add it under agents: or remove it from turn_order",
    ),
    (
        "turn-order-duplicate",
        {"env.turn_order": ["tool", "plan", "tool"]},
        "env.turn_order[2]",
        "listed twice",
    ),
    ("turn-order-empty", {"env.turn_order": []}, "env.turn_order", "List the agents"),
    ("agent-never-acts", {"env.turn_order": ["tool"]}, "agents.plan", "never act"),
    (
        "agent-unknown-pool",
        {"agents.plan.pool": "sharde"},
        "agents.plan.pool",
        "Did you mean 'shared'? Use one of the pools defined: 'shared'",
    ),
    ("k-zero", {"algorithm.k": 0}, "algorithm.k", "Set it to 1 or more"),
    (
        "grouping-typo",
        {"algorithm.grouping": "trajectry"},
        "algorithm.grouping",
        "Did you mean 'trajectory'?",
    ),
    (
        "grouping-unknown",
        {"algorithm.grouping": "episode"},
        "algorithm.grouping",
        "Or register it with @register_adv_est('episode')",
    ),
    ("loss-unknown", {"algorithm.policy_loss": "ppo"}, "algorithm.policy_loss", "'ppo_clip'"),
    (
        "lora-on-full",
        {"pools.shared.lora": {"rank": 8}},
        "pools.shared.lora",
        "Set specialization: lora or remove the lora block",
    ),
    ("unused-pool", {"pools.spare": {"model_path": "/m"}}, "pools.spare", "no agent uses"),
    ("eval-tasks-zero", {"run.eval_tasks": 0}, "run.eval_tasks", "eval_every_steps: 0"),
    (
        "top-p-high",
        {"agents.tool.train_sampling.top_p": 1.5},
        "agents.tool.train_sampling.top_p",
        "Use 1.0 to turn top-p off",
    ),
    (
        "top-p-zero",
        {"agents.plan.eval_sampling.top_p": 0},
        "agents.plan.eval_sampling.top_p",
        "in (0, 1]",
    ),
    (
        "top-k-zero",
        {"agents.tool.train_sampling.top_k": 0},
        "agents.tool.train_sampling.top_k",
        "Use -1 to turn top-k off",
    ),
    (
        "negative-temperature",
        {"agents.tool.train_sampling.temperature": -0.5},
        "agents.tool.train_sampling.temperature",
        "Use 0 for greedy",
    ),
    ("dual-clip-one", {"algorithm.dual_clip_c": 1}, "algorithm.dual_clip_c", "must be > 1"),
    ("clip-eps-one", {"algorithm.clip_eps_high": 1.0}, "algorithm.clip_eps_high", "in (0, 1)"),
    ("clip-eps-zero", {"algorithm.clip_eps_low": 0}, "algorithm.clip_eps_low", "in (0, 1)"),
    ("negative-kl", {"algorithm.kl_coef": -0.1}, "algorithm.kl_coef", ">= 0"),
    (
        "negative-staleness",
        {"algorithm.max_staleness": -1},
        "algorithm.max_staleness",
        "Use 0 for on-policy",
    ),
    (
        "pool-negative-staleness",
        {"pools.shared.max_staleness": -2},
        "pools.shared.max_staleness",
        "Use 0 for on-policy",
    ),
    (
        "cap-below-one",
        {"algorithm.behav_imp_cap": 0.5},
        "algorithm.behav_imp_cap",
        "must be 0 (the correction off) or >= 1, got 0.5. The usual values are 1 (V-trace) to 5",
    ),
    (
        "negative-cap",
        {"algorithm.behav_imp_cap": -1},
        "algorithm.behav_imp_cap",
        "0 turns the correction off",
    ),
    (
        "cap-off-with-stale-samples",
        {"algorithm.behav_imp_cap": 0, "pools.shared.max_staleness": 2},
        "algorithm.behav_imp_cap",
        "set behav_imp_cap to 1 or more (2 is the default) or max_staleness to 0 (pools shared)",
    ),
    (
        "partial-services",
        {"services": {"env": "localhost:1"}},
        "services",
        "either give every service address or none",
    ),
    (
        "empty-rollout-list",
        {"services": {**ADDRESSES, "rollout": {"shared": []}}},
        "services.rollout.shared",
        "at least one rollout address",
    ),
    (
        "services-unknown-pool",
        {"services": {**ADDRESSES, "trainer": {"shared": "t:1", "shard": "t:2"}}},
        "services.trainer.shard",
        "no pool named 'shard'",
    ),
    (
        "bad-address",
        {"services": {**ADDRESSES, "router": "router.svc"}},
        "services.router",
        "host:port",
    ),
]


@pytest.mark.parametrize("edits, field, fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_config_names_field_and_fix(edits, field, fragment):
    err = errors_of(edited(edits))
    assert (err.field, len(err.errors)) == (field, 1), str(err)
    assert fragment in err.message
    assert str(err) == f"{field}: {err.message}"


# (case id, file text or None for no file, fragment)
BAD_FILES = [
    ("missing-file", None, "file not found"),
    ("bad-yaml", "run:\n  name: x\n steps: [1,\n", "invalid YAML at line"),
    ("duplicate-key", "run:\n  name: a\n  name: b\n", "duplicate key 'name'"),
    ("empty-file", "", "the file is empty"),
]


@pytest.mark.parametrize(
    "text, fragment", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_bad_file_names_the_path(tmp_path, text, fragment):
    path = tmp_path / "run.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == str(path)
    assert fragment in str(info.value)


def test_top_level_must_be_a_mapping():
    with pytest.raises(ConfigError) as info:
        parse_config(["run"], source="cfg.yaml")  # type: ignore[arg-type]
    assert info.value.field == "cfg.yaml" and "mapping" in info.value.message


def test_all_errors_are_reported_at_once():
    err = errors_of(
        edited(
            {
                "run.stpes": 5,
                "algorithm.k": 0,
                "pools.shared.model_path": "http://hub/x",
                "agents.plan.pool": "nope",
                "agents.tool.train_sampling.top_p": 2,
            }
        )
    )
    fields = [f for f, _ in err.errors]
    assert sorted(fields) == sorted(
        [
            "run.stpes",
            "algorithm.k",
            "pools.shared.model_path",
            "agents.plan.pool",
            "agents.tool.train_sampling.top_p",
        ]
    )
    assert err.field == fields[0]
    lines = str(err).splitlines()
    assert lines[0] == "5 problems in <dict>:"
    assert all(any(line.strip().startswith(f + ":") for line in lines[1:]) for f in fields)
    clone = pickle.loads(pickle.dumps(err))  # errors survive crossing a process boundary
    assert (clone.errors, str(clone)) == (err.errors, str(err))


def test_a_malformed_value_does_not_cascade_into_rule_errors():
    # pools missing entirely: one error, not also "agent uses an unknown pool" for each agent
    err = errors_of(edited({"pools": DELETE}))
    assert err.errors == [("pools", "required field is missing. Add `pools:` at the top level")]
    # a bad specialization falls back to its default, which must not fire the lora rule
    err = errors_of(edited({"pools.shared.specialization": "lroa", "pools.shared.lora": {}}))
    assert [f for f, _ in err.errors] == ["pools.shared.specialization"]


def test_config_is_frozen():
    cfg = load_config(EXAMPLE)
    with pytest.raises(AttributeError):
        cfg.run.steps = 5  # type: ignore[misc]
    assert isinstance(cfg, RunConfig)

"""Each pool's engine context comes from the config (RunConfig.context_tokens): the local launcher
and the chart start engines with it, and `atgrpo config check` names a model whose own limit is
below it."""

import json

import yaml

from atgrpo.cli import main
from atgrpo.cli.runner import service_processes
from atgrpo.config import parse_config


def three_agents(tmp_path, engine="vllm") -> dict:
    """Agents a and b on pool x, c on pool y; sampling chosen so each maximum comes from
    elsewhere."""
    return {
        "run": {"name": "r", "run_dir": str(tmp_path / "run")},
        "env": {"name": "toy", "turn_order": ["a", "b", "c"]},
        "pools": {
            "x": {"model_path": str(tmp_path / "mx"), "engine": engine, "rollout_replicas": 2},
            "y": {"model_path": str(tmp_path / "my"), "engine": engine},
        },
        "agents": {
            "a": {
                "pool": "x",
                "train_sampling": {"max_prompt_tokens": 4096, "max_tokens": 2048},
                "eval_sampling": {"max_prompt_tokens": 1000, "max_tokens": 100},
            },
            "b": {
                "pool": "x",
                "train_sampling": {"max_prompt_tokens": 512, "max_tokens": 64},
                "eval_sampling": {"max_prompt_tokens": 3000, "max_tokens": 4000},
            },
            "c": {"pool": "y"},  # the defaults: 2048 + 256, train and eval
        },
    }


def test_context_is_the_longest_prompt_plus_response_of_the_pools_agents(tmp_path):
    cfg = parse_config(three_agents(tmp_path))
    # b's eval: 3000 + 4000 (a's train is 4096 + 2048 = 6144)
    assert cfg.context_tokens("x") == 7000
    assert cfg.context_tokens("y") == 2304  # 2048 + 256
    assert cfg.context_tokens("nobody") == 0


def test_the_launcher_starts_each_vllm_replica_with_its_pools_context(tmp_path):
    plan = {p.name: p.args for p in service_processes(parse_config(three_agents(tmp_path)))}
    for name, context in (
        ("rollout-x-0", "7000"),
        ("rollout-x-1", "7000"),
        ("rollout-y-0", "2304"),
    ):
        args = plan[name]
        assert args[args.index("--max-model-len") + 1] == context
    hf = {
        p.name: p.args for p in service_processes(parse_config(three_agents(tmp_path, engine="hf")))
    }
    assert "--max-model-len" not in hf["rollout-x-0"]  # transformers takes the model's own limit


def write_model(where, limit, **extra):
    where.mkdir(parents=True)
    (where / "config.json").write_text(json.dumps({"max_position_embeddings": limit, **extra}))


def two_agents(tmp_path) -> dict:
    """What config check builds: an env it can play (a then b), a on pool x and b on pool y."""
    data = three_agents(tmp_path)
    data["env"] = {
        "name": "careless",
        "path": "tests.env.sdk_envs:CarelessEnv",
        "turn_order": ["a", "b"],
        "max_turns": 2,
    }
    data["agents"] = {"a": {**data["agents"]["b"], "pool": "x"}, "b": {"pool": "y"}}
    return data


def test_config_check_names_a_model_whose_context_is_too_small(tmp_path, capsys):
    data = two_agents(tmp_path)
    write_model(tmp_path / "mx", 4096)
    write_model(tmp_path / "my", 32768)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        "pools.x: its agents need a context of 7000 tokens (agents.a.eval_sampling: "
        "max_prompt_tokens 3000 + "
        f"max_tokens 4000), but model '{tmp_path / 'mx'}' allows 4096 (max_position_embeddings in "
        f"its "
        "config.json). Lower max_prompt_tokens or max_tokens so they sum to at most 4096, or use a "
        "model with a longer context"
    ) in err
    assert "pools.y" not in err


def test_config_check_passes_when_the_model_is_long_enough_unknown_or_scaled(tmp_path, capsys):
    data = two_agents(tmp_path)
    # not guessed
    write_model(tmp_path / "mx", 4096, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    path = tmp_path / "run.yaml"  # my: no model yet
    path.write_text(yaml.safe_dump(data))
    assert main(["config", "check", str(path)]) == 0, capsys.readouterr().err

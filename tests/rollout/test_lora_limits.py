"""A LoRA pool's vLLM engine is started for the run's adapters: the rank it serves is the pool's
lora.rank rounded up to one vLLM offers, and it has a slot for every agent on the pool. Hard-coded
(rank 64, 8 slots), a rank over 64 or a ninth agent failed at the first push, minutes into a run.
The launcher, the chart and `atgrpo config check` derive or check them from the config."""

import argparse

import pytest

from atgrpo.cli.runner import service_processes
from atgrpo.cli.sizing import tensor_parallel_problem
from atgrpo.config import ConfigError, LoraConfig, PoolConfig, parse_config
from atgrpo.memory_rollout import rollout_components, vllm_lora_limits
from atgrpo.model_shape import ModelShape, load_shape
from atgrpo.rpc.main import SettingsError
from rollout_svc.__main__ import make_engine
from rollout_svc.engines import vllm
from rollout_svc.engines.vllm import check_full_push
from rollout_svc.settings import RolloutSettings
from tests.helm.conftest import named, pod_spec, template


def settings(*argv: str) -> RolloutSettings:
    ap = argparse.ArgumentParser()
    RolloutSettings.add_flags(ap)
    return RolloutSettings.from_args(ap.parse_args(list(argv)))


def lora_pool(rank: int, engine: str = "vllm") -> PoolConfig:
    return PoolConfig(
        model_path="/models/Qwen3-1.7B",
        engine=engine,
        specialization="lora",
        lora=LoraConfig(rank=rank),
    )


def l2_config(tmp_path, rank: int, agents: int) -> dict:
    names = [f"a{i}" for i in range(agents)]
    return {
        "run": {"name": "r", "run_dir": str(tmp_path / "run")},
        "env": {"name": "toy", "turn_order": names},
        "pools": {
            "x": {
                "model_path": str(tmp_path / "m"),
                "engine": "vllm",
                "specialization": "lora",
                "lora": {"rank": rank},
            }
        },
        "agents": {a: {"pool": "x"} for a in names},
    }


@pytest.mark.parametrize(
    "rank, want", [(8, 8), (16, 16), (40, 64), (65, 128), (300, 320), (512, 512)]
)
def test_the_engine_rank_is_the_smallest_vllm_offers_that_holds_the_pools(rank, want):
    assert vllm_lora_limits(lora_pool(rank), agents=9) == (want, 9)


def test_the_launcher_starts_vllm_with_the_runs_rank_and_a_slot_per_agent_plus_one(
    tmp_path, tiny_model, monkeypatch
):
    args = {p.name: p.args for p in service_processes(parse_config(l2_config(tmp_path, 100, 9)))}[
        "rollout-x-0"
    ]
    assert (
        args[args.index("--max-lora-rank") + 1] == "128"
        and args[args.index("--max-loras") + 1] == "9"
    )
    monkeypatch.setattr(vllm.VLLMEngine, "_start", lambda self, path: "no vLLM here")
    s = settings(
        "--pool",
        f"x={tiny_model}:lora",
        "--engine",
        "vllm",
        "--max-lora-rank",
        "128",
        "--max-loras",
        "9",
    )
    engine = make_engine(s, s.pools[0])
    # one slot per agent and a spare: a new adapter version loads without evicting another
    # agent's current one (vLLM evicts the least recently used adapter when its slots are full)
    assert (engine._kwargs["max_lora_rank"], engine._kwargs["max_loras"]) == (128, 10)
    assert "max_cpu_loras" not in engine._kwargs  # vLLM's default: max_loras, the same 10


def test_limits_vllm_cannot_take_are_refused_at_the_flag():
    with pytest.raises(SystemExit):  # argparse: 40 is not among vLLM's ranks
        settings("--pool", "x=/m:lora", "--max-lora-rank", "40")
    with pytest.raises(SettingsError, match="--max-loras 0: give the number of agents"):
        settings("--pool", "x=/m:lora", "--max-loras", "0")


def test_a_rank_over_vllms_largest_is_refused_by_config_check(tmp_path):
    with pytest.raises(
        ConfigError, match=r"pools.x.lora.rank: is 600, over the largest rank vLLM serves \(512\)"
    ):
        parse_config(l2_config(tmp_path, 600, 2))


def test_the_plan_counts_vllms_adapter_slots():
    shape = load_shape("/models/Qwen3-1.7B")
    got = rollout_components(shape, lora_pool(40), agents=3, k=4, tasks=8, sample_tokens=100)
    all_linears = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert got["adapters"] == 3 * shape.lora_params(64, all_linears) * 2  # 3 slots of rank 64, bf16
    hf = rollout_components(
        shape, lora_pool(40, engine="hf"), agents=3, k=4, tasks=8, sample_tokens=100
    )
    assert hf["adapters"] == 3 * shape.lora_params(40, ("q_proj", "k_proj", "v_proj", "o_proj")) * 2


def test_the_chart_starts_vllm_with_the_pools_rank_and_agents():
    objs = template(
        "--set", "pools.main.specialization=lora", "--set", "pools.main.config.lora.rank=40"
    )
    args = pod_spec(named(objs, "StatefulSet", "rl-atgrpo-rollout-main"))["containers"][0]["args"]
    # the default config: tool and plan
    assert "--max-lora-rank=64" in args and "--max-loras=2" in args


def test_tensor_parallel_must_split_the_heads_evenly():
    shape = ModelShape.from_config(
        {
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "vocab_size": 10,
        }
    )
    pool = PoolConfig(model_path="m", engine="vllm", rollout_gpus=3)
    assert "Use rollout_gpus: 2" in tensor_parallel_problem("x", pool, shape)
    for fine in (1, 2, 4, 8, 16):  # 8 and 16: the 4 KV heads are copied over the GPUs
        assert (
            tensor_parallel_problem(
                "x", PoolConfig(model_path="m", engine="vllm", rollout_gpus=fine), shape
            )
            is None
        )


def test_a_full_push_of_an_untied_model_must_carry_its_head():
    served = {"embed.weight": (10, 4), "lm_head.weight": (10, 4)}
    check_full_push(served, {"embed.weight": (10, 4)}, tied=True)  # the head is the embedding
    with pytest.raises(ValueError, match="push lm_head.weight too"):
        check_full_push(served, {"embed.weight": (10, 4)}, tied=False)

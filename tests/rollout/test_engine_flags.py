"""The rollout flags the launcher and the chart pass reach vLLM's LLM(...) arguments (checked on the
engine's kwargs with LLM itself stubbed: vLLM is not in this venv and starts in seconds to
minutes)."""

import argparse

import pytest

from atgrpo.rpc.main import SettingsError
from rollout_svc.__main__ import make_engine
from rollout_svc.engines import vllm
from rollout_svc.settings import RolloutSettings


def settings(*argv: str) -> RolloutSettings:
    ap = argparse.ArgumentParser()
    RolloutSettings.add_flags(ap)
    return RolloutSettings.from_args(ap.parse_args(list(argv)))


def test_tensor_parallel_context_and_memory_share_reach_the_engine(tiny_model, monkeypatch):
    monkeypatch.setattr(vllm.VLLMEngine, "_start", lambda self, path: "no vLLM here")
    s = settings(
        "--pool",
        f"p={tiny_model}",
        "--engine",
        "vllm",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "6144",
        "--gpu-memory-utilization",
        "0.45",
    )
    engine = make_engine(s, s.pools[0])
    assert engine.llm == "no vLLM here"
    assert {
        k: engine._kwargs[k]
        for k in ("tensor_parallel_size", "max_model_len", "gpu_memory_utilization")
    } == {"tensor_parallel_size": 2, "max_model_len": 6144, "gpu_memory_utilization": 0.45}
    assert engine.max_model_len == 6144  # what the replica cuts prompts to fit
    assert settings("--pool", f"p={tiny_model}").tensor_parallel_size == 1


@pytest.mark.parametrize("argv", [("--tensor-parallel-size", "0"), ("--tensor-parallel-size", "2")])
def test_tensor_parallel_needs_vllm_and_a_positive_size(argv):
    with pytest.raises(
        SettingsError, match="--tensor-parallel-size .*: give 1, or more with --engine vllm"
    ):
        settings(*argv)


def test_the_http_port_is_off_unless_given_and_0_picks_a_free_one():
    assert settings().http_port is None
    assert settings("--http-port", "0").http_port == 0
    assert settings("--http-port", "8000").http_port == 8000
    with pytest.raises(SettingsError, match="--http-port 70000: a port is between 1 and 65535"):
        settings("--http-port", "70000")

"""The committed stubs match the .proto files, and the contract has what DESIGN.md §2 names."""

import importlib.util
import sys

import pytest

from atgrpo._proto.v1 import env_pb2, rollout_pb2, router_pb2, sandbox_pb2, trainer_pb2
from tests.conftest import ROOT


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_committed_stubs_are_fresh():
    stale = _gen_module().stale_files()
    assert stale == [], f"run `make protos` and commit: {stale}"


def test_stale_stub_is_detected(tmp_path):
    gen = _gen_module()
    gen.generate(tmp_path)
    (tmp_path / "v1" / "env_pb2.py").write_text("# edited by hand\n")
    assert gen.stale_files(tmp_path) == ["v1/env_pb2.py"]


@pytest.mark.parametrize(
    "module, service, rpcs",
    [
        (
            env_pb2,
            "EnvService",
            {
                "ListEnvs",
                "Describe",
                "Reset",
                "Observe",
                "Step",
                "StepMany",
                "Fork",
                "Close",
                "ListTasks",
            },
        ),
        (sandbox_pb2, "SandboxService", {"Execute", "RunTests"}),
        (rollout_pb2, "RolloutService", {"Generate", "Collect", "LoadWeights", "GetInfo"}),
        (router_pb2, "RouterService", {"StartRun", "WatchRun", "StopRun", "GetRun"}),
        (trainer_pb2, "TrainerService", {"Train", "SaveCheckpoint", "GetInfo"}),
    ],
)
def test_every_design_rpc_exists_and_getinfo_everywhere(module, service, rpcs):
    methods = {m.name for m in module.DESCRIPTOR.services_by_name[service].methods}
    assert rpcs | {"GetInfo"} <= methods


def test_streaming_shapes_match_the_design():
    rollout = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].methods_by_name
    assert rollout["Collect"].server_streaming and not rollout["Collect"].client_streaming
    assert rollout["LoadWeights"].client_streaming and not rollout["LoadWeights"].server_streaming
    train = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].methods_by_name["Train"]
    assert train.client_streaming
    watch = router_pb2.DESCRIPTOR.services_by_name["RouterService"].methods_by_name["WatchRun"]
    assert watch.server_streaming


def test_turn_sample_carries_ids_and_logprobs_as_numbers():
    s = rollout_pb2.TurnSample(
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.5, -1.25],
        team_reward=1.0,
        local_reward=0.5,
    )
    back = rollout_pb2.TurnSample.FromString(s.SerializeToString())
    assert list(back.prompt_token_ids) == [1, 2, 3]
    assert list(back.response_logprobs) == [-0.5, -1.25]
    assert (back.team_reward, back.local_reward) == (1.0, 0.5)


def test_weights_travel_as_header_then_chunks():
    header = rollout_pb2.WeightChunk(
        header=rollout_pb2.WeightHeader(
            pool="p",
            version=3,
            format=rollout_pb2.WEIGHT_FORMAT_SAFETENSORS,
            total_bytes=4,
            digest="ab",
        )
    )
    data = rollout_pb2.WeightChunk(data=b"\x00\x01")
    assert header.WhichOneof("part") == "header"
    assert data.WhichOneof("part") == "data"

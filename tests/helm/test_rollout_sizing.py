"""The chart sizes each pool's vLLM replicas from the run config: the context its agents need
(RunConfig.context_tokens; never a fixed 4096 below it) and tensor parallelism over the replica's
GPUs, the same figures the run config it writes carries."""

from __future__ import annotations

import yaml

from atgrpo.config import parse_config
from tests.helm.conftest import (
    CHART,
    HelmError,
    named,
    pod_spec,
    pools_of,
    rendered,
    template,
    values_of,
)

FULLNAME = "rl-atgrpo"


def flags(objs, pool: str) -> dict[str, str]:
    args = pod_spec(named(objs, "StatefulSet", f"{FULLNAME}-rollout-{pool}"))["containers"][0][
        "args"
    ]
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def run_config(objs):
    cm = [o for o in objs if o["kind"] == "ConfigMap" and "run.yaml" in o.get("data", {})][0]
    return parse_config(yaml.safe_load(cm["data"]["run.yaml"]))


def test_every_ci_case_starts_vllm_with_its_agents_context_and_its_gpus(case):
    values_file, objs = case
    cfg = run_config(objs)
    for name, pool in pools_of(values_of(values_file)).items():
        if pool["engine"] != "vllm":
            continue
        got = flags(objs, name)
        want = pool["rollout"]["maxModelLen"] or cfg.context_tokens(name)
        assert int(got["max-model-len"]) == want >= cfg.context_tokens(name)
        assert (
            int(got["tensor-parallel-size"])
            == pool["rollout"]["gpus"]
            == cfg.pools[name].rollout_gpus
        )
        res = pod_spec(named(objs, "StatefulSet", f"{FULLNAME}-rollout-{name}"))["containers"][0][
            "resources"
        ]
        assert int(res["limits"]["nvidia.com/gpu"]) == pool["rollout"]["gpus"]
        share = pool["rollout"]["gpuMemoryUtilization"]
        assert cfg.pools[name].rollout_gpu_memory_utilization == share
        assert got.get("gpu-memory-utilization") == (str(share) if share else None)


def test_every_ci_case_writes_each_trainers_gpus_into_its_run_config(case):
    """trainer_gpus is what the chart starts (one rank per GPU; 0 GPUs: one CPU rank), so a plan
    of the written config is a plan of the pods."""
    values_file, objs = case
    cfg = run_config(objs)
    for name, pool in pools_of(values_of(values_file)).items():
        if pool["trainable"] is False:
            assert cfg.pools[name].trainer_gpus == 1  # the default: no trainer to size
            continue
        assert cfg.pools[name].trainer_gpus == max(1, pool["trainer"]["gpus"])


def test_the_l3_case_has_a_tensor_parallel_replica():
    objs = rendered(str(CHART / "ci" / "l3-two-gpu-pools-values.yaml"))
    assert flags(objs, "coder")["tensor-parallel-size"] == "2"


def test_a_code_config_gets_6144_tokens(tmp_path):
    """The code examples' sampling: prompts of 4096 and responses of 2048."""
    sampling = {"max_prompt_tokens": 4096, "max_tokens": 2048}
    values = {
        "run": {
            "config": {
                "agents": {
                    "tool": {"train_sampling": sampling},
                    "plan": {"eval_sampling": sampling},
                }
            }
        }
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    assert flags(template("-f", str(path)), "main")["max-model-len"] == "6144"


def test_a_max_model_len_below_the_need_is_refused(tmp_path):
    values = {"poolDefaults": {"rollout": {"maxModelLen": 2000}}}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    try:
        template("-f", str(path))
    except HelmError as err:
        assert (
            "pools.main.rollout.maxModelLen: 2000 is below the 2304 tokens this pool's agents need "
            "(their longest max_prompt_tokens + max_tokens in run.config.agents), so vLLM would "
            "refuse their longest requests. Remove maxModelLen (the chart then uses 2304)"
        ) in str(err)
    else:
        raise AssertionError("a maxModelLen below the agents' need rendered")

"""A run's plan (atgrpo.cli.sizing, atgrpo.cli.trainer_fit, atgrpo.cli.fit_report) from the example
configs: the checkpoints it keeps on disk, a trainer refused with the changes that would make it
fit, the train check's limits in local mode, and the pool settings `atgrpo plan` reads
(trainer_gpus, gpu_memory, gradient_checkpointing). The per-process figures it is built from are
checked by hand in test_memory.py."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from atgrpo.cli.fit_report import train_problem
from atgrpo.cli.sizing import size_run
from atgrpo.config import ConfigError, load_config, parse_config
from atgrpo.config_parse import parse_bytes
from atgrpo.memory import GiB
from tests.conftest import ROOT


@pytest.mark.parametrize(
    "run, written, at_once",
    [
        # 200 steps, every 20: 10 checkpoints; keep 3 + the best + the one being written = 5
        ({"steps": 200, "checkpoint_every_steps": 20, "eval_every_steps": 10}, 10, 5),
        # no evaluation: no best to keep
        ({"steps": 200, "checkpoint_every_steps": 20, "eval_every_steps": 0}, 10, 4),
        # keep every one
        ({"steps": 200, "checkpoint_every_steps": 20, "keep_checkpoints": 0}, 10, 10),
        # 45 steps, every 20: 20, 40 and the end (45); fewer than keep 3 + 2
        ({"steps": 45, "checkpoint_every_steps": 20}, 3, 3),
        # only at the end, plus step 0 when asked
        ({"steps": 10, "checkpoint_every_steps": 0, "checkpoint_at_start": True}, 2, 2),
        (
            {
                "steps": 100,
                "checkpoint_every_steps": 10,
                "checkpoint_at_start": True,
                "keep_checkpoints": 1,
            },
            11,
            3,
        ),
    ],
)
def test_checkpoints_a_run_keeps_on_disk(run, written, at_once, tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "toy_L1_gpu.yaml").read_text())
    data["run"].update(run)
    cfg = parse_config(data)
    (disk,) = size_run(cfg).disk
    assert (disk.checkpoints, disk.at_once) == (written, at_once)
    assert disk.trainer_volume == at_once * disk.checkpoint
    # vLLM: served + incoming
    assert disk.pushes_on_disk == 2 and disk.replica_disk == 2 * disk.push


def _gpu_example(name: str, **pool_edits) -> dict:
    data = yaml.safe_load((ROOT / "examples" / name).read_text())
    data = copy.deepcopy(data)
    for pool in data["pools"].values():
        pool.update(pool_edits)
    return data


def test_8b_full_on_one_80gb_gpu_is_refused_with_fixes():
    cfg = parse_config(_gpu_example("toy_L1_gpu.yaml", trainer_gpus=1, gpu_memory="80GiB"))
    plan = size_run(cfg, source="x")
    assert not plan.ok
    (trainer,) = [p for p in plan.processes if p.kind == "trainer"]
    assert trainer.fits is False and trainer.gpu_total > 140 * GiB
    assert any("trainer_gpus: 3" in f for f in trainer.fixes)
    assert any("specialization: lora" in f for f in trainer.fixes)
    assert size_run(cfg, gpus=8).ok and size_run(cfg, gpus=2, gpu_memory=141 * GiB).ok
    # FSDP's own bf16 gathers (no autocast casts) and the chunked head: 4 x 80 GB, and 3, suffice
    assert size_run(cfg, gpus=4).ok and size_run(cfg, gpus=3).ok and not size_run(cfg, gpus=2).ok


def test_checkpointing_off_is_named_as_the_fix_when_it_is_enough():
    cfg = parse_config(_gpu_example("code_L1_gpu.yaml", gradient_checkpointing=False))
    (trainer,) = [p for p in size_run(cfg).processes if p.kind == "trainer"]
    assert trainer.fits is False
    assert trainer.fixes[0] == "turn checkpointing on: pools.shared.gradient_checkpointing: true"
    tokens = int(re.search(r"micro_batch_tokens: (\d+)", trainer.fixes[1]).group(1))
    assert (
        6144 <= tokens < 16384
        and size_run(
            parse_config(
                _gpu_example(
                    "code_L1_gpu.yaml", gradient_checkpointing=False, micro_batch_tokens=tokens
                )
            )
        ).ok
    )


def test_train_check_passes_cpu_configs_without_a_model_and_states_local_limits():
    tiny = load_config(ROOT / "examples" / "toy_L1_tiny.yaml")
    data = tiny.to_dict()
    data["pools"]["shared"]["model_path"] = "/does/not/exist"
    assert train_problem(parse_config(data)) is None
    # a GPU pool with no memory stated, or whose model only the cluster has, is not checked
    assert (
        train_problem(parse_config(_gpu_example("toy_L1_gpu.yaml", gpu_memory="", trainer_gpus=1)))
        is None
    )
    assert (
        train_problem(
            parse_config(_gpu_example("code_L1_gpu.yaml", model_path="/cluster/Other-3B"))
        )
        is None
    )
    # local mode starts one trainer process: a pool sized for 4 GPUs is refused with the way to run
    # it
    problem = train_problem(parse_config(_gpu_example("toy_L1_gpu.yaml")))
    assert "local mode starts one trainer process" in problem and "trainer.gpus: 4" in problem
    connect = _gpu_example("toy_L1_gpu.yaml")
    connect["services"] = {
        "env": "e:1",
        "sandbox": "s:1",
        "router": "r:1",
        "rollout": {"shared": ["o:1"]},
        "trainer": {"shared": "t:1"},
    }
    assert train_problem(parse_config(connect)) is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80GiB", 80 * GiB),
        ("80Gi", 80 * GiB),
        ("141 GiB", 141 * GiB),
        ("80GB", 80 * 10**9),
        ("1.5TiB", 1536 * GiB),
        ("80", None),
        ("80 gigs", None),
        ("", None),
    ],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_gpu_settings_are_validated_with_the_fix():
    base = _gpu_example("code_L1_gpu.yaml")
    bad = copy.deepcopy(base)
    bad["pools"]["shared"].update(gpu_memory="80", trainer_gpus=0, gradient_checkpointing="yes")
    with pytest.raises(ConfigError) as info:
        parse_config(bad)
    fields = dict(info.value.errors)
    assert "80GiB" in fields["pools.shared.gpu_memory"]
    assert "at least 1" in fields["pools.shared.trainer_gpus"]
    assert "true or false" in fields["pools.shared.gradient_checkpointing"]
    cpu = copy.deepcopy(base)
    cpu["pools"]["shared"].update(device="cpu", trainer_gpus=2)
    with pytest.raises(ConfigError) as info:
        parse_config(cpu)
    assert "device: cuda" in dict(info.value.errors)["pools.shared.gpu_memory"]
    assert "device: cuda" in dict(info.value.errors)["pools.shared.trainer_gpus"]
    frozen = copy.deepcopy(base)
    frozen["pools"]["shared"].update(trainable=False, trainer_gpus=2)
    with pytest.raises(ConfigError) as info:
        parse_config(frozen)
    assert "not trainable" in dict(info.value.errors)["pools.shared.trainer_gpus"]

"""Local mode on GPUs (atgrpo.cli.placement): each process's CUDA_VISIBLE_DEVICES, and the vLLM
memory fraction of an engine that shares a GPU with a trainer, from `atgrpo plan`'s per-process
figures; refused with the fix when they cannot fit. Plus the pool settings behind it."""

import os

import pytest

from atgrpo.cli import launcher, placement
from atgrpo.cli.placement import Placement, PlacementError, local_placement, place
from atgrpo.cli.runner import service_processes
from atgrpo.cli.sizing import ProcessSizing, RunSizing, size_run
from atgrpo.config import ConfigError, parse_config
from atgrpo.memory import GiB

GPU = 100 * GiB  # usable: 90 GiB (plan.USABLE_FRACTION)


def config(**pool) -> dict:
    return {
        "run": {"name": "r"},
        "env": {"name": "toy", "turn_order": ["a"]},
        "pools": {"x": {"model_path": "/models/Qwen3-1.7B", "engine": "vllm", **pool}},
        "agents": {"a": {"pool": "x"}},
    }


def with_needs(monkeypatch, trainer_gib: float, rollout_gib: float, replicas: int = 1, tp: int = 1):
    """size_run stubbed to say: trainer-x needs trainer_gib, each rollout-x-i rollout_gib per
    GPU."""
    procs = [ProcessSizing("trainer-x", "trainer", "x", "cuda", 1, {"all": int(trainer_gib * GiB)})]
    procs += [
        ProcessSizing(f"rollout-x-{i}", "rollout", "x", "cuda", tp, {"all": int(rollout_gib * GiB)})
        for i in range(replicas)
    ]
    monkeypatch.setattr(placement, "size_run", lambda *a, **k: RunSizing("", tuple(procs), (), ()))


def test_one_gpu_shared_gives_the_engine_what_the_trainer_leaves(monkeypatch):
    with_needs(monkeypatch, trainer_gib=30, rollout_gib=10)
    got = place(parse_config(config()), ["0"], GPU)
    assert got.devices == {"trainer-x": "0", "rollout-x-0": "0"}
    assert got.memory_utilization == {"rollout-x-0": 0.6}  # (90 - 30) / 100


def test_two_gpus_split_one_process_each_and_no_fraction(monkeypatch):
    with_needs(monkeypatch, trainer_gib=30, rollout_gib=10)
    got = place(parse_config(config()), ["2", "3"], GPU)  # the ids this process was given
    assert got == Placement({"trainer-x": "2", "rollout-x-0": "3"}, {})


def test_more_processes_than_gpus_share_round_robin(monkeypatch):
    with_needs(monkeypatch, trainer_gib=30, rollout_gib=10, replicas=3)
    got = place(parse_config(config(rollout_replicas=3)), ["0", "1"], GPU)
    assert got.devices == {
        "trainer-x": "0",
        "rollout-x-0": "1",
        "rollout-x-1": "0",
        "rollout-x-2": "1",
    }
    # GPU 0: the trainer and one engine, (90 - 30) / 100; GPU 1: two engines, 90 / 2 / 100.
    assert got.memory_utilization == {"rollout-x-1": 0.6, "rollout-x-0": 0.45, "rollout-x-2": 0.45}


def test_tensor_parallel_replicas_take_several_gpus(monkeypatch):
    with_needs(monkeypatch, trainer_gib=30, rollout_gib=10, tp=2)
    got = place(parse_config(config(rollout_gpus=2)), ["0", "1", "2"], GPU)
    assert got == Placement({"trainer-x": "0", "rollout-x-0": "1,2"}, {})
    with pytest.raises(
        PlacementError,
        match=r"rollout-x-0 needs 2 GPUs \(pools.x.rollout_gpus\), but 1 are "
        "visible. Set pools.x.rollout_gpus: 1 or less",
    ):
        place(parse_config(config(rollout_gpus=2)), ["0"], GPU)


def test_not_enough_memory_is_refused_with_the_fixes(monkeypatch):
    with_needs(monkeypatch, trainer_gib=85, rollout_gib=10)
    with pytest.raises(PlacementError) as err:
        place(parse_config(config()), ["0"], GPU)
    assert str(err.value) == (
        "GPU 0 would be shared by trainer-x 85.0 GiB, rollout-x-0 10.0 GiB (at least, as `atgrpo "
        "plan` estimates), but only 90.0 GiB of it is usable. Any one of:\n  - more GPUs: 2 GPU "
        "processes want one each, 1 visible\n  - fewer processes: lower "
        "pools.<name>.rollout_replicas\n  - LoRA: pools.x.specialization: lora (a frozen base, no "
        "full optimizer state)\n  - a GPU with more memory\n  - set "
        "pools.x.rollout_gpu_memory_utilization to the share its engine may take"
    )


def test_a_fraction_set_in_the_config_is_kept_and_checked(monkeypatch):
    with_needs(monkeypatch, trainer_gib=30, rollout_gib=10)
    got = place(parse_config(config(rollout_gpu_memory_utilization=0.4)), ["0"], GPU)
    assert got.memory_utilization == {"rollout-x-0": 0.4}
    with pytest.raises(PlacementError, match="GPU 0 would be shared"):  # 30 + 70 > 90
        place(parse_config(config(rollout_gpu_memory_utilization=0.7)), ["0"], GPU)


def test_the_real_plan_on_one_80gb_gpu():
    """Qwen3-1.7B (the carried config), full bf16 on one 80 GiB GPU: the trainer's planned 36.3 GiB
    (its optimizer step: masters, casts, moments, gradients and AdamW's temporaries) leaves the
    engine (72 - 36.3) / 80 = 0.44; under LoRA (6.7 GiB) 0.81."""
    cfg = parse_config(config())
    trainer = next(
        p for p in size_run(cfg, gpu_memory=80 * GiB, local=True).processes if p.kind == "trainer"
    )
    assert round(trainer.gpu_total / GiB, 1) == 36.3
    assert place(cfg, ["0"], 80 * GiB).memory_utilization == {"rollout-x-0": 0.44}
    assert place(
        parse_config(config(specialization="lora")), ["0"], 80 * GiB
    ).memory_utilization == {"rollout-x-0": 0.81}


def test_cpu_runs_are_not_placed_and_cuda_without_a_gpu_is_refused():
    def no_probe():
        raise AssertionError("a CPU config probed the GPUs")

    assert (
        local_placement(parse_config(config(device="cpu", engine="hf")), probe=no_probe)
        == Placement()
    )
    # auto: cpu
    assert local_placement(parse_config(config()), probe=lambda: ([], 0)) == Placement()
    with pytest.raises(PlacementError, match="pools.x.device is cuda, but no GPU is visible here"):
        local_placement(parse_config(config(device="cuda")), probe=lambda: ([], 0))


def test_the_launcher_gets_each_process_its_gpus_and_flags():
    cfg = parse_config(config(rollout_gpus=2, rollout_replicas=2))
    gpus = Placement(
        {"trainer-x": "0", "rollout-x-0": "1,2", "rollout-x-1": "0,1"}, {"rollout-x-1": 0.55}
    )
    plan = {p.name: p for p in service_processes(cfg, gpus)}
    assert plan["trainer-x"].env == (("CUDA_VISIBLE_DEVICES", "0"),)
    assert plan["rollout-x-0"].env == (("CUDA_VISIBLE_DEVICES", "1,2"),)
    one, two = plan["rollout-x-0"].args, plan["rollout-x-1"].args
    assert (
        one[one.index("--tensor-parallel-size") + 1] == "2"
        and "--gpu-memory-utilization" not in one
    )
    assert two[two.index("--gpu-memory-utilization") + 1] == "0.55"
    assert plan["router"].env == () and plan["env"].env == ()


def test_an_asynchronous_run_on_cpu_shares_the_cores_between_rollout_and_trainer(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    data = config(device="cpu", engine="hf", rollout_replicas=3)
    sync = {p.name: p.env for p in service_processes(parse_config(data))}
    assert set(sync.values()) == {()}  # synchronous: torch's default, one per core
    data["algorithm"] = {"max_staleness": 1}
    plan = {p.name: p.env for p in service_processes(parse_config(data))}
    share = (("OMP_NUM_THREADS", "2"),)  # 8 cores over 3 replicas and 1 trainer
    assert plan == {
        **dict.fromkeys(sync, ()),
        "rollout-x-0": share,
        "rollout-x-1": share,
        "rollout-x-2": share,
        "trainer-x": share,
    }
    # a process on a GPU keeps only its devices; the user's own setting wins
    gpus = Placement({"trainer-x": "0"})
    assert {p.name: p.env for p in service_processes(parse_config(data), gpus)}["trainer-x"] == (
        ("CUDA_VISIBLE_DEVICES", "0"),
    )
    assert {p.name: p.env for p in service_processes(parse_config(data), gpus)}["rollout-x-0"] == (
        ("OMP_NUM_THREADS", "2"),
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert set(p.env for p in service_processes(parse_config(data))) == {()}


def test_spawn_sets_the_planned_environment(tmp_path, monkeypatch):
    seen = {}

    def fake_popen(argv, **kw):
        seen.update(kw)
        raise RuntimeError("not started")

    monkeypatch.setattr(launcher.subprocess, "Popen", fake_popen)
    (tmp_path / "logs").mkdir()
    with pytest.raises(RuntimeError):
        launcher._spawn(
            launcher.ServiceProcess("t", "trainer", (), (("CUDA_VISIBLE_DEVICES", "3"),)),
            tmp_path,
            "python",
            {},
            None,
        )
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "3" and "PATH" in seen["env"]


@pytest.mark.parametrize(
    "pool, field, says",
    [
        ({"rollout_gpus": 0}, "pools.x.rollout_gpus", "must be at least 1"),
        (
            {"rollout_gpus": 2, "engine": "hf"},
            "pools.x.rollout_gpus",
            "engine is 'hf', which runs on one GPU. Set engine: vllm",
        ),
        ({"rollout_gpus": 2, "device": "cpu"}, "pools.x.rollout_gpus", "runs on device: cpu"),
        (
            {"rollout_gpu_memory_utilization": 1.5},
            "pools.x.rollout_gpu_memory_utilization",
            "give a fraction in (0, 1]",
        ),
        (
            {"rollout_gpu_memory_utilization": 0.5, "engine": "hf"},
            "pools.x.rollout_gpu_memory_utilization",
            "engine is 'hf', which takes no memory fraction",
        ),
    ],
)
def test_gpu_placement_settings_are_validated_with_the_fix(pool, field, says):
    with pytest.raises(ConfigError) as err:
        parse_config(config(**pool))
    assert any(f == field and says in m for f, m in err.value.errors), err.value.errors


def test_the_plan_splits_a_tensor_parallel_replica_over_its_gpus():
    one, two = (
        next(
            p
            for p in size_run(parse_config(config(rollout_gpus=tp)), gpu_memory=80 * GiB).processes
            if p.kind == "rollout"
        )
        for tp in (1, 2)
    )
    assert (one.gpus, two.gpus) == (1, 2)
    assert (
        two.gpu["weights"] == one.gpu["weights"] // 2 and two.gpu["runtime"] == one.gpu["runtime"]
    )

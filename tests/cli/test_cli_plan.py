"""`atgrpo plan` as a user runs it, and `atgrpo train` refusing a config that cannot fit before it
starts a single service."""

from __future__ import annotations

import yaml

from atgrpo.cli import main
from tests.conftest import ROOT

EXAMPLES = ROOT / "examples"


def test_plan_passes_every_gpu_example_as_written(capsys):
    examples = sorted(EXAMPLES.glob("*_gpu.yaml"))
    assert len(examples) == 28  # 7 environments x L0-L3
    for path in examples:
        assert main(["plan", str(path)]) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        assert out.rstrip().endswith("fits") and "not checked" not in out, path.name
        assert (
            "trainer-" in out and "rollout-" in out and "sandbox" in out and "per checkpoint" in out
        )


def test_plan_refuses_8b_full_on_one_80gb_gpu_and_names_the_fix(capsys):
    path = EXAMPLES / "toy_L1_gpu.yaml"
    assert main(["plan", str(path), "--gpus", "1", "--gpu-memory", "80GiB"]) == 1
    out = capsys.readouterr().out
    assert "trainer-shared does not fit" in out and out.rstrip().endswith("does not fit")
    assert "pools.shared.trainer_gpus: 3" in out and "pools.shared.specialization: lora" in out
    # the flags override the file both ways: a bigger GPU fits with fewer of them
    assert main(["plan", str(path), "--gpus", "2", "--gpu-memory", "141GiB"]) == 0
    capsys.readouterr()


def test_plan_places_a_trainer_past_one_node_in_whole_nodes(capsys):
    path = EXAMPLES / "toy_L1_gpu.yaml"
    assert main(["plan", str(path), "--gpus", "16", "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "2 nodes x 8 GPUs: the chart runs it as a LeaderWorkerSet" in out
    # 8B full fits 3 GPUs of 80 GiB (below): one node holds it, so the plan says to prefer it
    assert "it also fits one node: prefer pools.shared.trainer_gpus: 3" in out
    # on 2-GPU nodes no one node holds it: two whole nodes, and nothing to prefer
    args = ["--gpus", "4", "--gpu-memory", "80GiB", "--gpus-per-node", "2"]
    assert main(["plan", str(path), *args]) == 0
    out = capsys.readouterr().out
    assert "2 nodes x 2 GPUs" in out and "fits one node" not in out
    assert main(["plan", str(path), "--gpus", "12", "--gpu-memory", "80GiB"]) == 1
    out = capsys.readouterr().out
    assert "pools.shared.trainer_gpus is 12, more than a node's 8 GPUs" in out
    assert "Use trainer_gpus: 8 or 16" in out
    # the fix it names is a count a cluster can place: 3 GPUs would fit (above), but on 2-GPU
    # nodes that is no whole number of nodes, so it names 4
    assert (
        main(["plan", str(path), "--gpus", "1", "--gpu-memory", "80GiB", "--gpus-per-node", "2"])
        == 1
    )
    assert "pools.shared.trainer_gpus: 4" in capsys.readouterr().out


def test_plan_of_a_cpu_config_reads_no_gpu_and_bad_flags_say_why(capsys):
    assert main(["plan", str(EXAMPLES / "toy_L1_tiny.yaml")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("fits")
    assert main(["plan", str(EXAMPLES / "code_L1_gpu.yaml"), "--gpu-memory", "80"]) == 2
    assert "80GiB" in capsys.readouterr().err
    assert main(["plan", str(EXAMPLES / "code_L1_gpu.yaml"), "--gpus", "0"]) == 2


def test_train_refuses_before_starting_any_service(tmp_path, capsys, monkeypatch):
    import atgrpo.cli.runner

    def must_not_start(*a, **kw):
        raise AssertionError("atgrpo train started the run of a config that does not fit")

    monkeypatch.setattr(atgrpo.cli.runner, "train", must_not_start)
    cfg = yaml.safe_load((EXAMPLES / "toy_L1_gpu.yaml").read_text())
    cfg["pools"]["shared"]["trainer_gpus"] = 1  # 8B full fine-tuning on one 80 GB GPU
    cfg["run"]["run_dir"] = str(tmp_path / "run")
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "trainer_gpus: 3" in err and "specialization: lora" in err
    assert not (tmp_path / "run").exists()

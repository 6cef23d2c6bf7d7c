"""scripts/gpu_check.py, the prepared GPU check, as a CPU smoke run: the same code paths at a small
size, so the script a GPU session runs once is known to work before a GPU is lent. A bare GPU
machine has torch and CUDA and no grpc: the trainer's parts run on an interpreter that has only
torch and the wheels the script lists for them."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from atgrpo.memory import trainer_peak
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

SMALL = [
    "--device",
    "cpu",
    "--size",
    "small",
    "--micro-batch-tokens",
    "512",
    "--sample-tokens",
    "64",
    "--gen-tokens",
    "8",
]


def gpu_check(env, out, *args, python=(sys.executable,)):
    done = subprocess.run(
        [*python, "scripts/gpu_check.py", *SMALL, *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, (json.loads(out.read_text()) if out.exists() else {})


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check

        return gpu_check
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def bare_site(where, dists) -> str:
    """A folder holding only `dists` (links to their files in this environment), for an interpreter
    run with -S: no site-packages but these, as on a machine where only they are installed."""
    where.mkdir()
    for name in dists:
        dist = importlib.metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            if (
                not top.endswith(".pth")
                and not (where / top).exists()
                and dist.locate_file(top).exists()
            ):
                (where / top).symlink_to(dist.locate_file(top))
    return str(where)


def test_the_gpu_check_runs_on_cpu_and_reports_every_part(tmp_path, subprocess_env, script):
    done, report = gpu_check(subprocess_env, tmp_path / "report.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trainer, services, push, logprobs = (
        report["trainer"],
        report["services"],
        report["push"],
        report["logprobs"],
    )
    assert (
        trainer["samples"] == 8
        and trainer["micro_batch_tokens"] == 512
        and trainer["tokens_per_s"] > 0
    )
    # The plan's peak: the resident parts plus the largest phase (atgrpo.memory.trainer_peak).
    assert trainer["peak_bytes"] > 0 and trainer["plan_bytes"] == trainer_peak(
        trainer["plan_components"]
    )
    assert trainer["reserved_bytes"] == 0  # no CUDA reserve on the CPU
    assert trainer["loss"] == trainer["loss"]  # a number, not NaN
    assert (
        services["exit_code"] == 0
        and services["steps"] == 3
        and services["staleness_max"] == [0, 0, 0]
    )
    assert services["services_host_peak_bytes"] > 0
    assert push["bytes_sent"] >= push["model_bytes"] > 0 and push["push_gb_per_s"] > 0
    # small: fixed costs dominate
    assert push["host_peak_growth_bytes"] > 0 and push["generate_tokens_per_s"] > 0
    # The example's transform (code_L1_gpu: top-k 20, top-p 0.9) in both checks that sample.
    assert (
        (logprobs["sampling"]["top_k"], logprobs["sampling"]["top_p"])
        == (20, 0.9)
        == (push["sampling"]["top_k"], push["sampling"]["top_p"])
    )
    # The example's pool trains in bf16 autocast, and the hf engine samples in float32 on the CPU:
    # the check sees them disagree (the float32 run below sees them agree).
    assert logprobs["autocast_bf16"] and logprobs["tokens"] > 0 and logprobs["max_abs_diff"] > 1e-3
    # each part ran in a process of its own, and imports every wheel listed
    for part in script.PARTS:
        assert set(script.NEEDS[part]) <= set(report[part]["wheels"]), part
        assert report[part]["host_peak_bytes"] > 0, part


def test_the_trainers_parts_run_with_only_torch_and_their_listed_wheels_and_the_rest_say_what_to_carry(  # noqa: E501
    tmp_path, subprocess_env, script
):
    have = script.closure(["torch", *script.NEEDS["trainer"], *script.NEEDS["logprobs"]])
    assert not {"grpcio", "protobuf", "peft"} & have
    env = {**subprocess_env, "PYTHONPATH": f"{bare_site(tmp_path / 'site', have)}:{ROOT}"}
    done, report = gpu_check(
        env,
        tmp_path / "report.json",
        "--parts",
        "trainer,logprobs,push",
        "--dtype",
        "float32",
        python=(sys.executable, "-S"),
    )
    assert "error" not in report["trainer"] and "error" not in report["logprobs"], done.stderr[
        -3000:
    ]
    assert report["trainer"]["loss"] == report["trainer"]["loss"]
    # the push needs grpc, which this machine lacks: skipped, naming what to carry, and the check
    # fails
    assert "grpcio" in report["push"]["skipped"] and done.returncode == 1
    assert not {"grpcio", "protobuf"} & set(
        report["trainer"]["wheels"] + report["logprobs"]["wheels"]
    )
    # float32 on both sides: the trainer scores the engine's tokens as the engine did
    lp = report["logprobs"]
    assert lp["tokens"] > 0 and lp["outside_support"] == 0 and lp["max_abs_diff"] < 1e-4
    assert lp["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    listed = script.wheels()
    assert {"grpcio", "protobuf"} <= set(listed["push"]) and {"grpcio", "protobuf"} <= set(
        listed["services"]
    )
    assert "torch" not in {w for ws in listed.values() for w in ws}  # the bare machine has it


def test_a_source_tree_that_was_never_installed_still_finds_its_built_in_envs(
    tmp_path, subprocess_env, script
):
    """The GPU machine gets the tree as files, with no atgrpo dist-info and so no entry points: its
    services part failed with "no environment named 'toy'; available: none". The built-ins are
    read from the tree's pyproject.toml then, the same table an install registers."""
    deps = script.closure(script.project_dependencies()) - {"atgrpo"}
    tree = tmp_path / "tree"  # the tree as it travels: no atgrpo.egg-info (git ignores it)
    tree.mkdir()
    for part in ("atgrpo", "env_svc", "pyproject.toml"):
        (tree / part).symlink_to(ROOT / part)
    env = {**subprocess_env, "PYTHONPATH": f"{bare_site(tmp_path / 'site', deps)}:{tree}"}
    code = (
        "import importlib.metadata as m, json\n"
        "from atgrpo.sdk.registry import Registry\n"
        "try:\n    m.distribution('atgrpo'); installed = True\n"
        "except m.PackageNotFoundError:\n    installed = False\n"
        "from env_svc.envs import BUILTIN\n"
        "print(json.dumps([installed, Registry().names(), sorted(BUILTIN),"
        " Registry().get('toy').__name__]))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installed, names, builtin, toy = json.loads(done.stdout)
    here = sorted(e.name for e in importlib.metadata.entry_points(group="atgrpo.envs"))
    assert not installed and names == builtin == here and toy == "ToyEnv"


def test_the_services_part_says_to_carry_bubblewrap_where_there_is_none(tmp_path, subprocess_env):
    """The H200 image has no bwrap: the sandbox service exited before serving and the part failed
    with the service's log. It is now skipped up front, naming what to carry."""
    path = f"{tmp_path}:{Path(sys.executable).parent}"  # no /usr/bin: no bwrap
    done, report = gpu_check(
        {**subprocess_env, "PATH": path}, tmp_path / "r.json", "--parts", "services"
    )
    assert done.returncode == 1 and "bubblewrap" in report["services"]["skipped"]

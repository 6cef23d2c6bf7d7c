"""Where the pods' files live: the models volume (each pool's modelPath on it), the datasets volume
(each dataset file env_svc reads on it), and the optional claims and populate Jobs that fill them.
Bounded storage is checked in test_storage_bounds.py, the volumes that cannot work in
test_storage_refused.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from env_svc.datasets import sources
from tests.helm.conftest import (
    CHART,
    FULLNAME,
    component,
    named,
    of_kind,
    pod_labels,
    pod_spec,
    pool_workload,
    pools_of,
    rendered,
    template,
    values_of,
)
from tests.helm.storage_objects import pods, run_config

WAITS = ("wait-for-models", "wait-for-datasets")  # the populate Jobs' readers


def under(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def mount_of(container: dict, volume: str) -> dict | None:
    return next((m for m in container.get("volumeMounts", []) if m["name"] == volume), None)


# ---- the models volume ---------------------------------------------------------------------


def test_every_pools_model_is_on_the_models_volume(case):
    values_file, objs = case
    values = values_of(values_file)
    mount_path = values["models"]["mountPath"]
    for pool, v in pools_of(values).items():
        for comp in ("rollout", "trainer") if v["trainable"] else ("rollout",):
            spec = pod_spec(pool_workload(objs, comp, pool))
            mount = mount_of(spec["containers"][0], "models")
            assert mount and mount["mountPath"] == mount_path
            assert under(v["modelPath"], mount["mountPath"]), (
                f"{pool}: {v['modelPath']} is not on the volume"
            )
            assert [x for x in spec["volumes"] if x["name"] == "models"]
            if not values["models"]["buildTiny"]:
                assert mount["readOnly"] is True
    # and the run config the services load from says the same paths
    cfg = run_config(objs)
    assert all(under(p.model_path, mount_path) for p in cfg.pools.values())


def populate_job(objs, store: str) -> dict:
    [job] = [j for j in of_kind(objs, "Job") if component(j) == store]
    return job


def script_commands(script: str) -> list[list[str]]:
    return [shlex.split(line) for line in script.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def hf_download_help() -> str:
    hf = Path(sys.executable).parent / "hf"
    return subprocess.run(
        [str(hf), "download", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def check_populate_job(
    objs, store: str, values: dict, hf_download_help: str
) -> tuple[list[list[str]], str]:
    """The Job fills the claim the readers mount, with `hf download`s of the installed CLI's
    flags, and writes the marker file last. -> (the hf commands, the marker)."""
    job = populate_job(objs, store)
    spec = pod_spec(job)
    [c] = spec["containers"]
    mount = mount_of(c, store)
    assert mount["mountPath"] == values[store]["mountPath"] and not mount.get("readOnly")
    [volume] = [v for v in spec["volumes"] if v["name"] == store]
    claim = volume["persistentVolumeClaim"]
    assert claim["claimName"] == f"{FULLNAME}-{store}" and claim["readOnly"] is False
    pvc = named(objs, "PersistentVolumeClaim", f"{FULLNAME}-{store}")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 3
    assert c["command"][:2] == ["/bin/sh", "-c"]
    commands = script_commands(c["command"][2])
    assert commands[0] == ["set", "-eu"]
    *_, (touch, marker) = commands
    assert touch == "touch" and under(marker, values[store]["mountPath"])
    downloads = [cmd for cmd in commands if cmd[:2] == ["hf", "download"]]
    assert len(downloads) == len(values[store]["populate"]["downloads"])
    for cmd in downloads:
        for flag in (a for a in cmd if a.startswith("--")):
            assert flag in hf_download_help, f"hf download has no {flag}"
    # the services' caches and HF_HUB_OFFLINE stay out of it: the Hub's cache goes to the volume
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert under(env["HF_HOME"], values[store]["mountPath"]) and "HF_HUB_OFFLINE" not in env
    assert "atgrpo.dev/metrics" not in pod_labels(job)
    return downloads, marker


def wait_init(spec: dict, store: str) -> tuple[str, list[str]]:
    """The init container that waits for a populate Job: (the marker it waits for, the paths it
    checks)."""
    [init] = [c for c in spec.get("initContainers", []) if c["name"] == f"wait-for-{store}"]
    script = init["command"][2]
    marker = re.search(r"until \[ -e '([^']+)' \]", script).group(1)
    paths = shlex.split(re.search(r"for p in (.*);", script).group(1))
    assert mount_of(init, store)["readOnly"] is True
    return marker, paths


def test_models_populate_job_fills_the_claim_the_pools_mount(helm, hf_download_help):
    values_file = str(CHART / "ci" / "models-populate-values.yaml")
    objs, values = rendered(values_file), values_of(values_file)
    downloads, marker = check_populate_job(objs, "models", values, hf_download_help)
    dirs = {cmd[cmd.index("--local-dir") + 1] for cmd in downloads}
    assert [
        "hf",
        "download",
        "Qwen/Qwen3-1.7B",
        "--repo-type",
        "model",
        "--revision",
        "main",
        "--local-dir",
        "/models/Qwen3-1.7B",
    ] == downloads[0][:9]
    for pool, v in pools_of(values).items():
        assert v["modelPath"] in dirs
        for comp in ("rollout", "trainer"):
            spec = pod_spec(pool_workload(objs, comp, pool))
            claim = next(x for x in spec["volumes"] if x["name"] == "models")[
                "persistentVolumeClaim"
            ]
            assert claim == {"claimName": f"{FULLNAME}-models", "readOnly": True}
            waits_for, paths = wait_init(spec, "models")
            assert waits_for == marker and paths == [f"{v['modelPath']}/config.json"]


def test_populate_is_off_by_default(helm):
    objs = rendered(None)
    assert [component(j) for j in of_kind(objs, "Job")] == ["run"]
    assert [p["metadata"]["name"] for p in of_kind(objs, "PersistentVolumeClaim")] == [
        f"{FULLNAME}-router"
    ]
    for name, spec in pods(objs):
        assert not [c for c in spec.get("initContainers", []) if c["name"] in WAITS], name
    env = pod_spec(named(objs, "Deployment", f"{FULLNAME}-env"))
    assert "datasets" not in [v["name"] for v in env["volumes"]]  # plan_path reads no files


def test_populate_with_your_own_command_and_image(helm, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "existingClaim": "shared-models",
                    "populate": {
                        "enabled": True,
                        "image": "amazon/aws-cli:2.17.0",
                        "command": ["aws", "s3", "sync", "s3://bucket/models", "/models"],
                        "tokenSecret": "hf-token",
                        "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                    },
                }
            }
        )
    )
    objs = template("-f", str(path))
    spec = pod_spec(populate_job(objs, "models"))
    [c] = spec["containers"]
    assert c["image"] == "amazon/aws-cli:2.17.0"
    # the command runs as given; the marker only when it succeeds
    assert c["command"][:4] == ["/bin/sh", "-c", c["command"][2], "populate"]
    assert c["command"][4:] == ["aws", "s3", "sync", "s3://bucket/models", "/models"]
    assert re.fullmatch(
        r"\"\$@\" && touch '/models/\.atgrpo-populated-[0-9a-f]{8}'", c["command"][2]
    )
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert env["HTTPS_PROXY"]["value"] == "http://proxy:3128"
    assert next(v for v in spec["volumes"] if v["name"] == "models")["persistentVolumeClaim"] == {
        "claimName": "shared-models",
        "readOnly": False,
    }
    assert not of_kind(objs, "PersistentVolumeClaim")[1:]  # the router's only: the claim exists
    rollout = pod_spec(named(objs, "StatefulSet", f"{FULLNAME}-rollout-main"))
    assert wait_init(rollout, "models")[0] in c["command"][2]


# ---- the datasets volume -------------------------------------------------------------------


def dataset_paths(cfg) -> list[str]:
    """The files env_svc reads for this config, as env_svc/datasets.py finds them."""
    if cfg.env.name not in ("math", "code"):
        return []
    return sorted(
        {s.path for s in sources(cfg.env.options, cfg.env.name).values() if s.dataset != "sample"}
    )


def test_env_dataset_files_are_on_the_datasets_volume(case):
    values_file, objs = case
    values = values_of(values_file)
    paths = dataset_paths(run_config(objs))
    env = pod_spec(named(objs, "Deployment", f"{FULLNAME}-env"))
    mount = mount_of(env["containers"][0], "datasets")
    if not paths:
        return
    assert (
        mount
        and mount["mountPath"] == values["datasets"]["mountPath"]
        and mount["readOnly"] is True
    )
    assert [v for v in env["volumes"] if v["name"] == "datasets"]
    for path in paths:
        assert under(path, mount["mountPath"]), path


def test_the_math_and_code_examples_read_their_files_from_the_volume():
    math = rendered(str(CHART / "ci" / "math-datasets-values.yaml"))
    assert dataset_paths(run_config(math)) == [
        "/data/aime_2024/aime_2024_problems.parquet",
        "/data/polaris/train.parquet",
    ]
    env = pod_spec(named(math, "Deployment", f"{FULLNAME}-env"))
    assert {
        "name": "datasets",
        "persistentVolumeClaim": {"claimName": "atgrpo-datasets", "readOnly": True},
    } in env["volumes"]
    code = rendered(str(CHART / "ci" / "code-datasets-values.yaml"))
    assert dataset_paths(run_config(code)) == ["/data/apps/test.jsonl"]


def test_datasets_populate_job_fills_what_the_env_reads(helm, hf_download_help):
    values_file = str(CHART / "ci" / "code-datasets-values.yaml")
    objs, values = rendered(values_file), values_of(values_file)
    downloads, marker = check_populate_job(objs, "datasets", values, hf_download_help)
    assert downloads == [
        [
            "hf",
            "download",
            "codeparrot/apps",
            "--repo-type",
            "dataset",
            "--local-dir",
            "/data/apps",
            "--include",
            "test.jsonl",
        ]
    ]
    env = pod_spec(named(objs, "Deployment", f"{FULLNAME}-env"))
    waits_for, paths = wait_init(env, "datasets")
    assert waits_for == marker and paths == dataset_paths(run_config(objs))
    # nothing else waits for the datasets, and no pool pod waits for models here
    for name, spec in pods(objs):
        inits = [c["name"] for c in spec.get("initContainers", []) if c["name"] in WAITS]
        assert inits == (["wait-for-datasets"] if name == f"{FULLNAME}-env" else []), name

"""Where the pods' files live: the models volume (each pool's modelPath on it), the datasets volume
(each dataset file env_svc reads on it), the optional claims and populate Jobs that fill them,
and bounded storage (every emptyDir has a size limit, every container ephemeral-storage requests
and limits that cover them), with defaults sized from the code's own figures (atgrpo.memory)."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atgrpo.cli.sizing import checkpoints_at_once, size_run
from atgrpo.config import parse_config
from atgrpo.memory import checkpoint_bytes
from atgrpo.model_shape import load_shape
from env_svc.datasets import sources
from tests.helm.conftest import (
    CHART,
    ROOT,
    HelmError,
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

FULLNAME = "rl-atgrpo"
WAITS = ("wait-for-models", "wait-for-datasets")  # the populate Jobs' readers
GIB = 1024**3
UNITS = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": GIB,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "m": 1e-3,
}


def quantity(q) -> float:
    """A Kubernetes quantity in bytes."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)", str(q))
    assert m and m.group(2) in UNITS, f"{q!r} is not a quantity"
    return float(m.group(1)) * UNITS[m.group(2)]


def pods(objs):
    """(name, pod spec) of every object that runs pods."""
    return [(o["metadata"]["name"], pod_spec(o)) for o in objs if pod_spec(o) is not None]


def run_config(objs):
    cm = [o for o in of_kind(objs, "ConfigMap") if "run.yaml" in o.get("data", {})][0]
    return parse_config(yaml.safe_load(cm["data"]["run.yaml"]))


def under(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def mount_of(container: dict, volume: str) -> dict | None:
    return next((m for m in container.get("volumeMounts", []) if m["name"] == volume), None)


def rejected(tmp_path, values: dict, *extra: str, base: bool = True) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(HelmError) as err:
        template("-f", str(path), *extra, base=base)
    assert "atgrpo: invalid values:" in str(err.value)
    return str(err.value)


# ---- bounded storage -----------------------------------------------------------------------


def test_every_emptydir_is_bounded_and_every_container_has_ephemeral_storage(case):
    _, objs = case
    assert pods(objs)
    for name, spec in pods(objs):
        disk = 0.0
        for v in spec.get("volumes", []):
            if "emptyDir" in v:
                assert "sizeLimit" in (v["emptyDir"] or {}), (
                    f"{name}: emptyDir {v['name']} has no sizeLimit"
                )
                if v["emptyDir"].get("medium") != "Memory":
                    disk += quantity(v["emptyDir"]["sizeLimit"])
        for c in spec["containers"] + spec.get("initContainers", []):
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                assert "ephemeral-storage" in res.get(kind, {}), (
                    f"{name}/{c['name']}: no ephemeral-storage {kind}"
                )
            assert quantity(res["requests"]["ephemeral-storage"]) <= quantity(
                res["limits"]["ephemeral-storage"]
            )
        # the kubelet evicts a pod whose emptyDirs and containers use more than its containers'
        # limits added up: they must cover every disk-backed emptyDir filled to its limit
        limit = sum(
            quantity(c["resources"]["limits"]["ephemeral-storage"]) for c in spec["containers"]
        )
        assert disk <= limit, (
            f"{name}: emptyDirs may hold {disk / GIB:.1f} GiB, limit {limit / GIB:.1f} GiB"
        )


def example_disks():
    """(example, atgrpo plan's disk figures) of every pool of examples/*_gpu.yaml whose model
    atgrpo knows the shape of."""
    out = []
    for path in sorted((ROOT / "examples").glob("*_gpu.yaml")):
        cfg = parse_config(yaml.safe_load(path.read_text()), source=str(path))
        out += [(path.name, cfg.pools[d.pool].model_path, d) for d in size_run(cfg).disk]
    return out


def test_rollout_tmp_holds_a_weight_swap_of_every_example_model():
    """A vLLM replica writes each full-weight push into a new model-* directory under /tmp and
    deletes the old one once the new one serves: two copies during a swap (atgrpo plan's
    replica_disk), plus compile caches."""
    defaults = values_of(None)["poolDefaults"]["rollout"]
    disks = example_disks()
    assert {Path(model).name for _, model, _ in disks} >= {"Qwen3-1.7B", "Qwen3-8B"}
    caches = 4 * GIB
    for example, _, d in disks:
        assert quantity(defaults["tmpSize"]) >= d.replica_disk + caches, (
            f"{example} pool {d.pool}: {(d.replica_disk + caches) / GIB:.1f} GiB"
        )
    assert max(d.replica_disk for _, _, d in disks) == 2 * max(d.push for _, _, d in disks)


def test_checkpoint_volume_holds_the_kept_checkpoints_of_the_default_model():
    """(keep_checkpoints + the best + the one being written) x one checkpoint
    (state.PoolState.save), as atgrpo plan counts them, for the default run and for any longer
    one."""
    cfg = run_config(rendered(None))
    size = quantity(values_of(None)["poolDefaults"]["trainer"]["checkpoints"]["size"])
    [d] = size_run(cfg).disk
    assert 20 * GIB < d.checkpoint < 25 * GIB  # Qwen3-1.7B: 1.72 B parameters x 14 bytes under bf16
    assert size >= d.trainer_volume
    longer = dataclasses.replace(cfg.run, steps=10_000)
    assert checkpoints_at_once(longer) == cfg.run.keep_checkpoints + 2 == 5
    assert size >= checkpoints_at_once(longer) * d.checkpoint
    # a LoRA checkpoint is its adapters: far smaller
    pool = cfg.pools["main"]
    lora = dataclasses.replace(pool, specialization="lora")
    assert checkpoint_bytes(load_shape(pool.model_path), lora, agents=2) < d.checkpoint / 50


def test_an_ephemeral_limit_below_the_emptydirs_is_refused(helm, tmp_path):
    error = rejected(tmp_path, {"router": {"persistence": {"enabled": False}}})
    assert (
        "router.resources.limits.ephemeral-storage: 2Gi is below what the pod's emptyDirs may "
        "hold, /tmp 1Gi + data 10Gi = 11.0Gi, so the kubelet would evict the pod before they fill. "
        "Raise it to at least 12Gi"
    ) in error
    error = rejected(tmp_path, {"poolDefaults": {"rollout": {"tmpSize": "60Gi"}}})
    assert "pools.main.rollout.resources.limits.ephemeral-storage: 41Gi is below" in error
    error = rejected(tmp_path, {"env": {"resources": {"limits": {"ephemeral-storage": None}}}})
    assert (
        "env.resources.limits.ephemeral-storage: not set, so the pod could fill its node's disk"
        in error
    )
    error = rejected(tmp_path, {"models": {"volume": {"emptyDir": {}}}})
    assert re.search(
        r"volume models of pools\.main\.(rollout|trainer): an emptyDir without sizeLimit could "
        r"fill its node's disk\. Give it one",
        error,
    )


def test_a_limit_that_covers_the_emptydirs_is_accepted(helm, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "router": {
                    "persistence": {"enabled": False},
                    "resources": {"limits": {"ephemeral-storage": "12Gi"}},
                }
            }
        )
    )
    router = pod_spec(named(template("-f", str(path)), "Deployment", f"{FULLNAME}-router"))
    assert {"name": "data", "emptyDir": {"sizeLimit": "10Gi"}} in router["volumes"]


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


# ---- what the chart refuses ----------------------------------------------------------------

MATH = {
    "name": "math",
    "max_turns": 4,
    "turn_order": ["tool", "plan"],
    "options": {
        "train": {"dataset": "math", "path": "/data/polaris/train.parquet"},
        "eval": {"dataset": "aime2024", "path": "/data/aime/aime.parquet"},
    },
}
QWEN = {"repo": "Qwen/Qwen3-1.7B", "dir": "Qwen3-1.7B"}

REFUSED = {
    "model outside the models volume": (
        {"poolDefaults": {"modelPath": "/opt/model"}},
        'pools.main.modelPath: "/opt/model" is not below models.mountPath "/models", where the '
        "models volume is "
        "mounted (the images hold no models). Put the model on the volume and use e.g. "
        "/models/model",
    ),
    "model the populate Job does not download": (
        {
            "models": {
                "populate": {
                    "enabled": True,
                    "downloads": [{"repo": "Qwen/Qwen3-8B", "dir": "Qwen3-8B"}],
                }
            }
        },
        'pools.main.modelPath: "/models/Qwen3-1.7B" is not where models.populate.downloads puts a '
        "model "
        "(/models/Qwen3-8B), so the pods would wait for it forever. Add a download with dir: "
        "Qwen3-1.7B",
    ),
    "no models volume": (
        {"models": {"existingClaim": ""}},
        "models: no volume for the models. Set models.existingClaim",
    ),
    "populate and the tiny model": (
        {
            "models": {"buildTiny": True, "populate": {"enabled": True, "downloads": [QWEN]}},
            "poolDefaults": {"modelPath": "/models/tiny"},
        },
        "models.populate.enabled: models.buildTiny builds the tiny model in each pod",
    ),
    "populate with nothing to do": (
        {"models": {"populate": {"enabled": True}}},
        "models.populate.enabled: nothing to do. List downloads",
    ),
    "populate with both command and downloads": (
        {"models": {"populate": {"enabled": True, "downloads": [QWEN], "command": ["true"]}}},
        "models.populate: both command and downloads are set",
    ),
    "created claim and a volume": (
        {
            "models": {
                "create": {"enabled": True},
                "volume": {"nfs": {"server": "nfs", "path": "/m"}},
            }
        },
        "models: create.enabled and volume are both set",
    ),
    "populate without a datasets volume": (
        {"datasets": {"populate": {"enabled": True, "downloads": [QWEN]}}},
        "datasets.populate.enabled: there is no volume to fill. Set datasets.create.enabled",
    ),
    "dataset file without a datasets volume": (
        {"run": {"config": {"env": MATH}}},
        'run.config.env.options.train.path: "/data/polaris/train.parquet" is a file env_svc reads, '
        "but the env pods "
        "have no dataset volume. Set datasets.existingClaim",
    ),
    "dataset file outside the datasets volume": (
        {
            "datasets": {"existingClaim": "ds"},
            "run": {
                "config": {
                    "env": {
                        **MATH,
                        "options": {"path": "/srv/apps.jsonl", "dataset": "apps"},
                        "name": "code",
                    }
                }
            },
        },
        'run.config.env.options.path: "/srv/apps.jsonl" is not below datasets.mountPath "/data", '
        "where the env pods "
        "see the dataset volume. Use e.g. /data/apps.jsonl",
    ),
    "dataset file the populate Job does not fetch": (
        {
            "datasets": {
                "create": {"enabled": True},
                "populate": {
                    "enabled": True,
                    "downloads": [
                        {
                            "repo": "POLARIS-Project/Polaris-Dataset-53K",
                            "repoType": "dataset",
                            "dir": "polaris",
                        }
                    ],
                },
            },
            "run": {"config": {"env": MATH}},
        },
        'run.config.env.options.eval.path: "/data/aime/aime.parquet" is not below a directory '
        "datasets.populate.downloads fills (/data/polaris/)",
    ),
}


@pytest.mark.parametrize("values, message", REFUSED.values(), ids=REFUSED.keys())
def test_volumes_that_cannot_work_are_refused(helm, tmp_path, values, message):
    assert message in rejected(tmp_path, values)


def test_a_sample_dataset_needs_no_volume(helm, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump({"run": {"config": {"env": {**MATH, "options": {"dataset": "sample"}}}}})
    )
    env = pod_spec(named(template("-f", str(path)), "Deployment", f"{FULLNAME}-env"))
    assert "datasets" not in [v["name"] for v in env["volumes"]]


def test_download_entries_are_checked_by_the_schema(helm, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "populate": {
                        "enabled": True,
                        "downloads": [{"repo": "Qwen/Qwen3-1.7B", "dir": "../etc"}],
                    }
                }
            }
        )
    )
    with pytest.raises(HelmError, match="at '/models/populate/downloads/0/dir'"):
        template("-f", str(path))

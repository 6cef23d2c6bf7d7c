"""Volumes that cannot work are refused at render time, saying what to set: a model or a dataset
file off its volume or not fetched by the populate Job, a populate Job with nothing (or too much)
to do, no volume to fill; a sample dataset needs no volume, and download entries are checked by
the schema."""

from __future__ import annotations

import pytest
import yaml

from tests.helm.conftest import FULLNAME, HelmError, named, pod_spec, template
from tests.helm.storage_objects import rejected

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

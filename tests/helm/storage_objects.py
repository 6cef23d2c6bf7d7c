"""What the storage tests (test_storage.py, test_storage_bounds.py, test_storage_refused.py) share:
the release's object names, the pods a render runs, the run config it hands them, and rendering
values the chart must refuse."""

from __future__ import annotations

import pytest
import yaml

from atgrpo.config import parse_config
from tests.helm.conftest import HelmError, of_kind, pod_spec, template


def pods(objs):
    """(name, pod spec) of every object that runs pods."""
    return [(o["metadata"]["name"], pod_spec(o)) for o in objs if pod_spec(o) is not None]


def run_config(objs):
    cm = [o for o in of_kind(objs, "ConfigMap") if "run.yaml" in o.get("data", {})][0]
    return parse_config(yaml.safe_load(cm["data"]["run.yaml"]))


def rejected(tmp_path, values: dict, *extra: str, base: bool = True) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(HelmError) as err:
        template("-f", str(path), *extra, base=base)
    assert "atgrpo: invalid values:" in str(err.value)
    return str(err.value)

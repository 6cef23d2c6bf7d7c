"""`atgrpo submit` and `atgrpo runs --release` against FakeApiServer (a recording fake of the
Kubernetes API; no API server runs here), with a release built from this repo's chart as Helm
stores one, and the real helm binary rendering it."""

from __future__ import annotations

import base64
import json

import kubernetes_validate
import pytest
import yaml

from atgrpo.cli import main
from atgrpo.cli.release import decode_release, encode_release
from tests.cluster.conftest import (
    CONFIG,
    INSTALL_VALUES,
    NS,
    RELEASE,
    ROUTER,
    config_file,
    helm_template,
    submit,
)
from tests.cluster.fake_apiserver import FakeApiServer


def test_release_round_trip_is_helms_format():
    """decode_release reads what Helm writes: the API's base64 of Helm's base64 of gzip JSON."""
    release = {"name": "x", "chart": {"metadata": {"name": "c"}}, "config": {"a": 1}}
    data = encode_release(release)
    assert base64.b64decode(base64.b64decode(data))[:2] == b"\x1f\x8b"
    assert decode_release(data) == release


def test_submit_creates_the_chart_rendered_run_owned_by_the_release(cluster, tmp_path, capsys):
    assert submit(cluster, config_file(tmp_path), "--detach") == 0
    (cm_post,) = cluster.sent("POST", "configmaps")
    (job_post,) = cluster.sent("POST", "jobs")
    cm, job = cm_post.body, job_post.body
    # exactly what the chart renders with this run enabled (the ownerReferences aside)
    expected = helm_template(
        {**INSTALL_VALUES, "run": {"enabled": True, "config": CONFIG}}, tmp_path
    )
    want = {
        (o["kind"], o["metadata"]["name"]): o
        for o in expected
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "run"
    }
    router_uid = cluster.stored("deployments")[ROUTER]["metadata"]["uid"]
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": ROUTER, "uid": router_uid}
    for sent in (cm, job):
        meta = dict(sent["metadata"])
        assert meta.pop("ownerReferences") == [owner]
        assert {**sent, "metadata": meta} == want[(sent["kind"], meta["name"])]
    for obj in (cm, job):  # what the API server would take, at the oldest and newest minor
        for version in ("1.30", "1.37"):
            kubernetes_validate.validate(obj, version, strict=True)
    # the run's config: this file's, on the release's pools and services
    run = yaml.safe_load(cm["data"]["run.yaml"])
    assert run["run"]["name"] == "toy-a" and run["env"]["name"] == "toy"
    assert set(run["pools"]) == {"main"} and run["services"]["router"].startswith(ROUTER)
    # the ConfigMap goes with its Job from now on (a JSON patch, so the Deployment is no owner)
    job_uid = cluster.stored("jobs")[job["metadata"]["name"]]["metadata"]["uid"]
    (patch,) = cluster.sent("PATCH", "configmaps")
    assert "json-patch" in patch.content_type
    stored_cm = cluster.stored("configmaps")[cm["metadata"]["name"]]
    assert stored_cm["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": job_uid}
    ]
    assert f"job/{job['metadata']['name']} in ml created" in capsys.readouterr().out


def test_a_retried_submit_finds_its_run_and_makes_no_second(cluster, tmp_path, capsys):
    assert submit(cluster, config_file(tmp_path), "--detach") == 0
    assert submit(cluster, config_file(tmp_path), "--detach") == 0
    assert len(cluster.stored("jobs")) == 1 and len(cluster.stored("configmaps")) == 1
    assert "already submitted" in capsys.readouterr().out
    # a different config is a different run
    other = {**CONFIG, "run": {**CONFIG["run"], "name": "toy-b"}}
    assert submit(cluster, config_file(tmp_path, other), "--detach") == 0
    assert len(cluster.stored("jobs")) == 2


@pytest.mark.parametrize(
    ("cfg", "said"),
    [
        ({**CONFIG, "pools": {"x": {"model_path": "/m"}}}, "trains the release's pools"),
        ({**CONFIG, "services": {"router": "h:1"}}, "the release's services run it"),
        ({**CONFIG, "algorithm": {"k": 0}}, "algorithm.k"),
        ({**CONFIG, "env": {"name": "toy", "turn_order": ["tool", "plan"], "bogus": 1}}, "bogus"),
    ],
)
def test_a_bad_config_is_refused_before_anything_is_created(cluster, tmp_path, capsys, cfg, said):
    assert submit(cluster, config_file(tmp_path, cfg), "--detach") == 2
    assert said in capsys.readouterr().err
    assert not cluster.sent("POST") and not cluster.sent("PATCH")


def test_a_missing_release_says_where_to_look(cluster, tmp_path, capsys):
    code = main(
        [
            "submit",
            str(config_file(tmp_path)),
            "--release",
            "nope",
            "-n",
            NS,
            "--kubeconfig",
            str(cluster.kubeconfig_path),
            "--detach",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "no Helm release 'nope' in namespace 'ml'" in err and "helm list -n ml" in err


def test_a_refused_job_leaves_no_config_behind(cluster, tmp_path, capsys):
    cluster.refuse[("POST", "jobs")] = (403, 'jobs.batch is forbidden: User "me" cannot create')
    assert submit(cluster, config_file(tmp_path), "--detach") == 2
    err = capsys.readouterr().err
    assert "cannot create (HTTP 403)" in err and "kubectl auth can-i create jobs" in err
    assert cluster.sent("POST", "configmaps") and cluster.sent("DELETE", "configmaps")
    assert cluster.stored("configmaps") == {} and cluster.stored("jobs") == {}


def test_an_unreachable_api_server_is_named(tmp_path, capsys):
    with FakeApiServer() as fake:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(fake.kubeconfig()))
    # the fake is gone: nothing listens there any more
    code = main(["runs", "--release", RELEASE, "--kubeconfig", str(kubeconfig)])
    assert code == 2
    assert "no Kubernetes API answer from http://127.0.0.1:" in capsys.readouterr().err


def test_runs_lists_the_releases_runs(cluster, tmp_path, capsys):
    assert submit(cluster, config_file(tmp_path), "--detach") == 0
    (job_name,) = cluster.stored("jobs")
    capsys.readouterr()
    # another release's run in the same namespace is not this one's
    stranger = {
        **cluster.stored("jobs")[job_name],
        "metadata": {
            "name": "other-run",
            "namespace": NS,
            "labels": {"app.kubernetes.io/instance": "other", "app.kubernetes.io/component": "run"},
        },
    }
    cluster.put("apis/batch/v1", stranger)
    job = cluster.stored("jobs")[job_name]
    job["status"] = {
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the backoff limit",
            }
        ]
    }
    assert (
        main(["runs", "--release", RELEASE, "--kubeconfig", str(cluster.kubeconfig_path), "--json"])
        == 0
    )
    (row,) = yaml.safe_load(capsys.readouterr().out)
    assert (row["job"], row["run"], row["state"], row["source"]) == (
        job_name,
        "toy-a",
        "failed",
        "submit",
    )
    assert row["reason"] == "BackoffLimitExceeded: Job has reached the backoff limit"
    assert main(["runs", "--release", RELEASE, "--kubeconfig", str(cluster.kubeconfig_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "RUN", "STATE", "CREATED", "BY"]
    assert lines[1].startswith(job_name) and "failed (BackoffLimitExceeded" in lines[1]


def test_an_object_the_api_would_refuse_is_refused_with_its_field(cluster):
    """The fake's schema check can fail (a Job with a misspelt field gets the API's 422), and
    the client's own check of a body comes back as an error that says what to do."""
    import urllib.error
    import urllib.request

    from kubernetes import client

    from atgrpo.cli.submit import Cluster, ClusterError

    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": NS},
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}
            },
            "backofLimit": 1,
        },
    }
    post = urllib.request.Request(
        f"{cluster.url}/apis/batch/v1/namespaces/{NS}/jobs",
        json.dumps(job).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(post)
    assert refused.value.code == 422
    assert (
        "spec: Additional properties are not allowed ('backofLimit'"
        in refused.value.read().decode()
    )
    assert cluster.stored("jobs") == {}
    cluster.invalid.clear()  # seen, as intended
    c = Cluster.connect(str(cluster.kubeconfig_path))
    with pytest.raises(
        ClusterError, match=r"Job j: the kubernetes client .* refuses it \(spec.backofLimit: Extra"
    ):
        c._create_or_exists(client.BatchV1Api(c.api).create_namespaced_job, NS, job)


def test_the_releases_own_run_is_followed_and_left_as_helm_made_it(cluster, tmp_path, capsys):
    """The config the release itself runs (run.enabled) renders to the same names: submit finds
    that Job, and leaves Helm's ConfigMap to Helm (no patch)."""
    own = helm_template({**INSTALL_VALUES, "run": {"enabled": True, "config": CONFIG}}, tmp_path)
    for o in own:
        if o["kind"] in ("ConfigMap", "Job") and "-run-" in o["metadata"]["name"]:
            cluster.put("api/v1" if o["kind"] == "ConfigMap" else "apis/batch/v1", o)
    assert submit(cluster, config_file(tmp_path), "--detach") == 0
    assert "was already submitted" in capsys.readouterr().out
    assert cluster.sent("PATCH") == []
    (cm,) = cluster.stored("configmaps").values()
    assert "ownerReferences" not in cm["metadata"]


@pytest.mark.parametrize(
    ("refused", "warned"),
    [
        (("PATCH", "configmaps"), "handing ConfigMap"),  # the run is made all the same
        (("GET", "version"), "rendering for helm's default version"),
    ],
)
def test_what_submit_can_do_without_is_a_warning(cluster, tmp_path, capsys, refused, warned):
    cluster.refuse[refused] = (403, "forbidden")
    assert submit(cluster, config_file(tmp_path), "--detach") == 0
    assert warned in capsys.readouterr().err
    assert len(cluster.stored("jobs")) == 1 and len(cluster.stored("configmaps")) == 1

"""`atgrpo submit` and `atgrpo runs --release` against FakeApiServer (a recording fake of the
Kubernetes API; no API server runs here), with a release built from this repo's chart as Helm
stores one, and the real helm binary rendering it."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml

from atgrpo._proto.v1 import router_pb2_grpc
from atgrpo.cli import main
from atgrpo.cli.release import decode_release, encode_release
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
    assert "cannot reach the API server at http://127.0.0.1:" in capsys.readouterr().err


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


class ScriptedLoop:
    """A fake RunLoop (names it as such): three empty steps, then finished. It pins how submit
    follows a run; the loop itself is tested in tests/router."""

    def __init__(self, cfg, emit):
        from atgrpo.rundir import RunDir

        self.cfg, self.emit, self.completed, self.resumed_from = cfg, emit, 0, 0
        self.dir = RunDir(cfg.run.run_dir)
        self.stop_requested = asyncio.Event()
        self.clients = SimpleNamespace(close=lambda: asyncio.sleep(0))

    async def prepare(self):
        pass

    async def run(self):
        from router_svc.events import step_event
        from router_svc.steps import StepBatches

        for step in range(1, self.cfg.run.steps + 1):
            await asyncio.sleep(0.2)
            self.completed = step
            timings = {
                "rollout_seconds": 0.1,
                "train_seconds": 0.1,
                "weight_sync_seconds": 0.0,
                "step_seconds": 0.2,
                "time": time.time(),
                "retries": 0,
                "replicas": {},
                "requeued_tasks": 0,
            }
            self.emit(step_event(step, StepBatches({}, {}, 0), [], {}, timings))
        return "finished"


class Router:
    """A real router gRPC server (ScriptedLoop runs its runs) on its own thread and event loop."""

    def __enter__(self):
        from atgrpo.rpc.server import Binding, create_server
        from router_svc.runs import Runs
        from router_svc.server import RouterServicer

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        servicer = RouterServicer(Runs(ScriptedLoop))
        binding = Binding(
            "atgrpo.v1.RouterService", servicer, router_pb2_grpc.add_RouterServiceServicer_to_server
        )
        self.server = self.call(create_server([binding]))
        self.address = f"127.0.0.1:{self.server.port}"
        return self

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def __exit__(self, *exc):
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_submit_follows_the_run_its_job_starts_to_the_end(cluster, tmp_path, capsys):
    from router_svc.client import RouterClient

    with Router() as router:

        def job_starts_the_run(job):
            """What the Job's container does: `atgrpo train /config/run.yaml --connect`."""
            time.sleep(1.0)  # the init container's wait
            cm = cluster.stored("configmaps")[job["metadata"]["name"]]
            run_yaml = cm["data"]["run.yaml"].replace(
                f"/data/runs/{CONFIG['run']['name']}", str(tmp_path / "router-side")
            )

            stored = cluster.stored("jobs")[job["metadata"]["name"]]
            stored["status"] = {"active": 1}

            async def train_connect():
                async with RouterClient(router.address) as client:
                    status = await client.start_run(run_yaml)
                    async for _ in client.watch_run(status["run_id"]):
                        pass

            router.call(train_connect())
            stored["status"] = {
                "succeeded": 1,
                "conditions": [{"type": "Complete", "status": "True"}],
            }

        cluster.on_create["jobs"] = job_starts_the_run
        mirror = tmp_path / "mirror"
        code = submit(
            cluster, config_file(tmp_path), "--router", router.address, "--run-dir", str(mirror)
        )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "run toy-a finished at step 3" in out
    steps = [
        e["step"]
        for e in map(json.loads, (mirror / "metrics.jsonl").read_text().splitlines())
        if e["kind"] == "step"
    ]
    assert steps == [1, 2, 3]


def test_submit_says_when_the_job_fails_before_its_run_starts(cluster, tmp_path, capsys):
    with Router() as router:

        def job_fails(job):
            stored = cluster.stored("jobs")[job["metadata"]["name"]]
            stored["status"] = {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ]
            }

        cluster.on_create["jobs"] = job_fails
        code = submit(cluster, config_file(tmp_path), "--router", router.address)
    assert code == 1
    err = capsys.readouterr().err
    assert "failed (BackoffLimitExceeded: Job has reached the specified backoff limit)" in err
    assert "kubectl logs -n ml job/rl-atgrpo-run-" in err


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


def test_an_unreachable_router_says_how_to_reach_it():
    """From a laptop the release's in-cluster router address does not resolve: submit says how
    to port-forward it, once the router has been out of reach for reach_s."""
    from atgrpo.cli.submit import ClusterError, wait_started
    from router_svc.client import RouterClient

    async def go():
        async with RouterClient("127.0.0.1:1", timeout_s=1.0) as client:
            await wait_started(
                client,
                "toy-a",
                lambda: ("pending", ""),
                "-n ml job/j",
                "-n ml svc/rl-atgrpo-router",
                poll_s=0.1,
                reach_s=0.5,
            )

    started = time.monotonic()
    with pytest.raises(
        ClusterError,
        match=r"cannot reach the router at 127\.0\.0\.1:1 .*"
        r"kubectl port-forward -n ml svc/rl-atgrpo-router 50051",
    ):
        asyncio.run(go())
    assert time.monotonic() - started < 30


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

"""`atgrpo submit CONFIG --release NAME`: a run created on a cluster through its API server, then
followed through the router as `atgrpo train --connect` follows one; `atgrpo runs --release`
lists a release's runs.

The run's ConfigMap and Job are rendered by the release's own chart (atgrpo.cli.release), so
they are what `helm upgrade --set run.enabled=true` would make, and are created with the
`kubernetes` client:

1. the ConfigMap, owned by the release's router Deployment;
2. the Job, owned by the same Deployment: `helm uninstall` deletes the router and, with it,
   every run submitted to it (Kubernetes' garbage collector);
3. the ConfigMap handed over to the Job (a JSON patch of its ownerReferences), so a Job that is
   deleted, or ends and outlives its TTL, takes its config with it.

A Job's name is a hash of its config, so a submit retried after a lost reply finds its own Job
(409) and follows it: one run, never two. The router runs one run at a time; a run submitted
while another trains waits in its Job's init container and then fails on StartRun
(FAILED_PRECONDITION): `atgrpo runs` shows which.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from atgrpo.cli.release import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    RUN_COMPONENT,
    ReleaseError,
    RenderedRun,
    decode_release,
    helm_binary,
    newest_deployed,
    pick_run,
    release_keys_problem,
    render,
)
from atgrpo.errors import AtgrpoError

FINAL = ("stopped", "finished", "failed")
POLL_S = 2.0
# How long the router may stay unreachable before submit says how to reach it (the run goes on).
REACH_S = 60.0
IN_CLUSTER_NS = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ClusterError(Exception):
    """The cluster refused or could not be asked; the message says what to do."""


@dataclass
class Cluster:
    """The few API calls submit makes, with the API's errors turned into ClusterError."""

    api: Any  # kubernetes.client.ApiClient

    @classmethod
    def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> Cluster:
        try:
            from kubernetes import client, config
        except ImportError:
            raise ClusterError(
                "the kubernetes client is not installed: pip install 'atgrpo[cluster]'"
            ) from None
        try:
            if kubeconfig or context or _has_kubeconfig():
                return cls(config.new_client_from_config(config_file=kubeconfig, context=context))
            config.load_incluster_config()  # inside a pod: its ServiceAccount
            return cls(client.ApiClient())
        except config.ConfigException as err:
            raise ClusterError(
                f"no cluster to talk to ({err}): give --kubeconfig/--context, or set KUBECONFIG"
            ) from None

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
        """The API's JSON answer as a dict: the client's typed models are stricter than the API
        (a field a server leaves out fails them), and nothing here needs them."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return json.loads(fn(*args, _preload_content=False, **kw).data or b"{}")
        except ApiException as err:
            raise ClusterError(f"{what}: {_api_problem(err)}") from None
        except (HTTPError, ValueError) as err:  # no answer, or not the API's JSON
            host = self.api.configuration.host
            raise ClusterError(
                f"{what}: no Kubernetes API answer from {host} ({type(err).__name__}); check "
                "`kubectl cluster-info` with the same kubeconfig and context"
            ) from None

    def _apis(self):
        from kubernetes import client

        return client.CoreV1Api(self.api), client.AppsV1Api(self.api), client.BatchV1Api(self.api)

    def kube_version(self) -> str:
        from kubernetes import client

        try:
            version = self._call("reading its version", client.VersionApi(self.api).get_code)
        except ClusterError as err:  # helm's own default then; the chart's checks still run
            print(f"warning: {err}; rendering for helm's default version", file=sys.stderr)
            return ""
        return version.get("gitVersion", "")

    def release(self, name: str, ns: str) -> dict[str, Any]:
        core, _, _ = self._apis()
        found = self._call(
            f"reading release {name!r}",
            core.list_namespaced_secret,
            ns,
            label_selector=f"owner=helm,name={name}",
        )
        pairs = [
            (s["metadata"].get("labels") or {}, (s.get("data") or {}).get("release", ""))
            for s in found.get("items") or []
        ]
        return decode_release(newest_deployed(pairs, name, ns))

    def owner(self, deployment: str, ns: str) -> dict[str, Any]:
        _, apps, _ = self._apis()
        d = self._call(
            f"reading the release's router Deployment {deployment!r}",
            apps.read_namespaced_deployment,
            deployment,
            ns,
        )
        return _owner_ref("apps/v1", "Deployment", d["metadata"]["name"], d["metadata"]["uid"])

    def create(self, run: RenderedRun, ns: str, owner: dict[str, Any]) -> bool:
        """Create the run's objects; whether this call created the Job (False: it was there)."""
        from kubernetes.client.exceptions import ApiException

        core, _, batch = self._apis()
        cm, job = _owned(run.config_map, owner), _owned(run.job, owner)
        made_cm = self._create_or_exists(core.create_namespaced_config_map, ns, cm)
        try:
            made_job = self._create_or_exists(batch.create_namespaced_job, ns, job)
        except ClusterError:
            if made_cm:  # nothing half-made stays behind
                try:
                    core.delete_namespaced_config_map(run.name, ns, _preload_content=False)
                except ApiException:
                    pass
            raise
        if made_job is None:  # an earlier submit of this config made it, and handed its config
            return False
        try:
            self._hand_over(run.name, ns, owner, made_job["metadata"]["uid"], made_cm is not None)
        except ClusterError as err:  # the run is made: say so, and go on
            print(f"warning: {err}; the ConfigMap stays the router's", file=sys.stderr)
        return True

    def _hand_over(self, name: str, ns: str, owner: dict, job_uid: str, made_now: bool) -> None:
        """The ConfigMap to its Job (a JSON patch of its ownerReferences: with a strategic merge
        the router would stay an owner, and it would outlive the Job). Only while the router owns
        it: a ConfigMap the chart made is Helm's and stays as it is."""
        core, _, _ = self._apis()
        if not made_now:
            cm = self._call(f"reading ConfigMap {name}", core.read_namespaced_config_map, name, ns)
            if cm["metadata"].get("ownerReferences") != [owner]:
                return
        ref = _owner_ref("batch/v1", "Job", name, job_uid)
        self._call(
            f"handing ConfigMap {name} to its Job",
            core.patch_namespaced_config_map,
            name,
            ns,
            [{"op": "replace", "path": "/metadata/ownerReferences", "value": [ref]}],
        )

    def _create_or_exists(
        self, fn: Callable[..., Any], ns: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The object as created, or None when one of its name exists (a hash of its config)."""
        from kubernetes.client.exceptions import ApiException
        from pydantic import ValidationError

        what = f"creating {body['kind']} {body['metadata']['name']}"
        try:
            return json.loads(fn(ns, body, _preload_content=False).data)
        except ValidationError as err:  # the client checks a body against its own models first
            from kubernetes import __version__

            first = err.errors()[0]
            field = ".".join(str(p) for p in first["loc"][1:])  # [0] is the argument's index
            raise ClusterError(
                f"{what}: the kubernetes client {__version__} refuses it ({field}: "
                f"{first['msg']}): upgrade it to one as new as the cluster"
            ) from None
        except ApiException as err:
            if err.status == 409:
                return None
            raise ClusterError(f"{what}: {_api_problem(err)}") from None

    def job_state(self, name: str, ns: str) -> tuple[str, str]:
        _, _, batch = self._apis()
        job = self._call(f"reading Job {name}", batch.read_namespaced_job_status, name, ns)
        return job_state(job.get("status") or {})

    def runs(self, release: str, ns: str) -> list[dict[str, Any]]:
        core, _, batch = self._apis()
        selector = f"{INSTANCE_LABEL}={release},{COMPONENT_LABEL}={RUN_COMPONENT}"
        jobs = self._call("listing runs", batch.list_namespaced_job, ns, label_selector=selector)
        maps = self._call(
            "listing run configs", core.list_namespaced_config_map, ns, label_selector=selector
        )
        return run_rows(jobs.get("items") or [], maps.get("items") or [])


def _has_kubeconfig() -> bool:
    return bool(os.environ.get("KUBECONFIG")) or Path("~/.kube/config").expanduser().exists()


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context (as kubectl picks it), or the pod's own."""
    try:
        from kubernetes import config
    except ImportError:  # Cluster.connect says how to install it
        return "default"
    try:
        if kubeconfig or context or _has_kubeconfig():
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            chosen = next((c for c in contexts if c["name"] == context), active)
            return (chosen.get("context") or {}).get("namespace") or "default"
        return Path(IN_CLUSTER_NS).read_text().strip() or "default"
    except (config.ConfigException, OSError):
        return "default"


def _api_problem(err: Any) -> str:
    """The API's own message (a Status body), with what to do for the usual refusals."""
    try:
        message = json.loads(err.body or "{}").get("message") or err.reason
    except (ValueError, AttributeError):
        message = err.reason
    hint = {
        401: "your credentials were refused: log in again (kubectl config view --minify)",
        403: "submit needs, in the namespace: get/list on secrets and get on deployments (the "
        "release), create/get/list/patch/delete on configmaps and jobs (kubectl auth can-i "
        "create jobs -n NS)",
        404: "check --namespace and --release (helm list -A)",
    }.get(err.status)
    return f"{message} (HTTP {err.status})" + (f": {hint}" if hint else "")


def _owner_ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}


def _owned(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    meta = {**obj["metadata"], "ownerReferences": [owner]}
    return {**obj, "metadata": meta}


def job_state(status: dict[str, Any]) -> tuple[str, str]:
    """(pending|running|succeeded|failed, the reason given) of a Job's status."""
    for c in status.get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded", ""
        if c.get("type") in ("Failed", "FailureTarget"):
            return "failed", f"{c.get('reason', '')}: {c.get('message', '')}".strip(": ")
    if status.get("active") or status.get("ready"):
        return "running", ""
    return "pending", ""


def run_rows(jobs: list[dict[str, Any]], maps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row per run Job, oldest first: its name, run, state, when and how it was made."""
    names = {}
    for m in maps:
        try:
            cfg = yaml.safe_load(m.get("data", {}).get("run.yaml", "")) or {}
            names[m["metadata"]["name"]] = (cfg.get("run") or {}).get("name", "?")
        except yaml.YAMLError:
            names[m["metadata"]["name"]] = "?"
    rows = []
    for j in jobs:
        meta = j["metadata"]
        state, why = job_state(j.get("status") or {})
        owners = [o.get("kind") for o in meta.get("ownerReferences") or []]
        rows.append(
            {
                "job": meta["name"],
                "run": names.get(meta["name"], "?"),
                "state": state,
                "reason": why,
                "created": str(meta.get("creationTimestamp", "")),
                "source": "submit" if "Deployment" in owners else "chart",
            }
        )
    return sorted(rows, key=lambda r: (r["created"], r["job"]))


def format_runs(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs"
    head = ("JOB", "RUN", "STATE", "CREATED", "BY")
    table = [head] + [
        (
            r["job"],
            r["run"],
            r["state"] + (f" ({r['reason']})" if r["reason"] else ""),
            r["created"],
            r["source"],
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    )


def prepare(cluster: Cluster, config_path: Path, release: str, ns: str) -> RenderedRun:
    """The run as the release's chart renders it, checked as `atgrpo config check` would; every
    refusal comes before anything is created."""
    from atgrpo.config import ConfigError, load_yaml_config
    from atgrpo.config_parse import load_yaml

    try:
        run_config = load_yaml(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ClusterError(f"{config_path}: cannot read it as YAML ({err})") from None
    if not isinstance(run_config, dict):
        raise ClusterError(f"{config_path}: expected a run config (a mapping: run:, env:, agents:)")
    problem = release_keys_problem(run_config)
    if problem:
        raise ClusterError(f"{config_path}: {problem}")
    rel = cluster.release(release, ns)
    objects = render(rel, run_config, kube_version=cluster.kube_version(), helm=helm_binary())
    run = pick_run(objects, release)
    try:
        load_yaml_config(run.run_yaml, source=f"{config_path} on release {release}")
    except ConfigError as err:
        raise ClusterError(f"{config_path}: invalid config\n{err}") from None
    return run


async def wait_started(
    client: Any,
    run_id: str,
    job: Callable[[], tuple[str, str]],
    where: str,
    service: str = "svc/<release>-atgrpo-router",
    *,
    poll_s: float = POLL_S,
    reach_s: float = REACH_S,
) -> dict[str, Any]:
    """The run's status once its Job has started it on the router (or the Job has ended)."""
    from atgrpo.errors import DeadlineExceeded, NotFound, Unavailable

    unreachable_since = None
    while True:
        state, why = await asyncio.to_thread(job)
        if state == "failed":
            raise ClusterError(f"{where} failed ({why}): kubectl logs {where} --all-containers")
        try:
            status = await client.get_run(run_id)
            unreachable_since = None
            # A run of this name that has ended may be an earlier one: the Job follows its run
            # to the end, so once the Job has succeeded too, the ended run is this one.
            if status["state"] not in FINAL or state == "succeeded":
                return status
        except NotFound:
            unreachable_since = None
        except (Unavailable, DeadlineExceeded) as err:  # no route, or no answer in time
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > reach_s:
                raise ClusterError(
                    f"cannot reach the router at {client.address} ({err}); the run goes on. "
                    f"From outside the cluster: kubectl port-forward {service} 50051, then "
                    "--router 127.0.0.1:50051"
                ) from None
        await asyncio.sleep(poll_s)


async def follow(cluster: Cluster, run: RenderedRun, ns: str, router: str, mirror: Path):
    """Follow the run through the router to its end; its events mirrored under `mirror`."""
    from atgrpo.cli.report import Reporter
    from atgrpo.cli.runner import follow_run
    from atgrpo.config import load_yaml_config
    from router_svc.client import RouterClient

    cfg = load_yaml_config(run.run_yaml).with_overrides(run_dir=str(mirror))
    async with RouterClient(router) as client:
        status = await wait_started(
            client,
            cfg.run.name,
            lambda: cluster.job_state(run.name, ns),
            f"-n {ns} job/{run.name}",
            f"-n {ns} svc/{run.router}",  # the router Service has its Deployment's name
        )
        reporter = Reporter(cfg, mirror=True)
        reporter.start(status)
        return await follow_run(client, run.run_yaml, status, reporter)


def submit(args: Any) -> int:
    try:
        cluster = Cluster.connect(args.kubeconfig, args.context)
        run = prepare(cluster, args.config, args.release, args.namespace)
        owner = cluster.owner(run.router, args.namespace)
        made = cluster.create(run, args.namespace, owner)
    except (ClusterError, ReleaseError) as err:
        print(f"atgrpo submit: {err}", file=sys.stderr)
        return 2
    said = "created" if made else "was already submitted (same config)"
    print(f"job/{run.name} in {args.namespace} {said}, owned by deployment/{run.router}")
    if args.detach:
        return 0
    router = args.router or yaml.safe_load(run.run_yaml)["services"]["router"]
    mirror = args.run_dir or Path("runs") / args.release / run.name
    try:
        final = asyncio.run(follow(cluster, run, args.namespace, router, mirror))
    except (ClusterError, AtgrpoError) as err:  # the run goes on: `atgrpo runs` shows it
        print(f"atgrpo submit: {err}", file=sys.stderr)
        return 1
    print(
        f"run {final['run_id']} {final['state']} at step {final['step']}"
        + (f": {final['error']}" if final.get("error") else "")
    )
    return 0 if final["state"] in ("finished", "stopped") else 1


def runs(args: Any) -> int:
    try:
        rows = Cluster.connect(args.kubeconfig, args.context).runs(args.release, args.namespace)
    except ClusterError as err:
        print(f"atgrpo runs: {err}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else format_runs(rows))
    return 0


# --- the commands ---------------------------------------------------------------------------------


def add_command(sub: argparse._SubParsersAction) -> None:
    su = _cluster_args(
        sub.add_parser(
            "submit",
            help="create a run on an installed release (its ConfigMap and Job as the chart renders "
            "them) and follow it through the router",
        )
    )
    su.add_argument("config", type=Path, help="the run config (no pools: or services:)")
    su.add_argument(
        "--router",
        help="the router's HOST:PORT to follow the run through (default: the release's "
        "in-cluster address; from outside, `kubectl port-forward` it)",
    )
    su.add_argument(
        "--run-dir", type=Path, help="where the followed events go (default: runs/RELEASE/JOB)"
    )
    su.add_argument("--detach", action="store_true", help="create the run, do not follow it")
    su.set_defaults(fn=_cmd_submit)
    ru = _cluster_args(sub.add_parser("runs", help="a release's runs: the chart's and submitted"))
    ru.add_argument("--json", action="store_true")
    ru.set_defaults(fn=_cmd_runs)


def _cluster_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--release", required=True, help="the atgrpo Helm release (helm list)")
    p.add_argument(
        "--namespace", "-n", help="the release's namespace (default: the context's, as kubectl)"
    )
    p.add_argument("--kubeconfig", help="the kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="the kubeconfig context (default: its current one)")
    return p


def _cmd_submit(args: argparse.Namespace) -> int:
    args.namespace = args.namespace or default_namespace(args.kubeconfig, args.context)
    return submit(args)


def _cmd_runs(args: argparse.Namespace) -> int:
    args.namespace = args.namespace or default_namespace(args.kubeconfig, args.context)
    return runs(args)

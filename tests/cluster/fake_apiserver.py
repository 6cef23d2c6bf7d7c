"""FakeApiServer: a small recording HTTP fake of the Kubernetes API, for `atgrpo submit` and
`atgrpo runs` (no API server runs here).

It keeps namespaced objects in memory and answers the REST calls the `kubernetes` client makes:
list (with a label selector), create (201; 409 when the name exists; 422 when the object fails
the API's OpenAPI schema, checked with kubernetes-validate as the API server would; with the uid
and creationTimestamp the server would set), get, JSON and merge patches, delete, and /version.
Every request is recorded, body included, so a test checks exactly what was sent. A test can
refuse a (method, resource) with a status, and can hook a resource's creation (a Job's creation
is where the real cluster would start the run).
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

KIND_OF = {
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "jobs": "Job",
    "deployments": "Deployment",
}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    content_type: str


@dataclass
class FakeApiServer:
    kube_version: str = "v1.33.2"
    # (group/version path, namespace, resource) -> name -> object
    objects: dict[tuple[str, str, str], dict[str, dict]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    refuse: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    on_create: dict[str, Callable[[dict], None]] = field(default_factory=dict)
    hook_errors: list[BaseException] = field(default_factory=list)  # a test asserts it empty
    invalid: list[dict] = field(default_factory=list)  # objects refused by the schema check

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def put(self, group: str, obj: dict) -> dict:
        """Store `obj` as if it had been created (group: "api/v1", "apis/apps/v1", ...)."""
        meta = obj["metadata"]
        key = (group, meta["namespace"], obj["kind"].lower() + "s")
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", str(uuid.uuid4()))
        stored["metadata"].setdefault("creationTimestamp", _now())
        with self._lock:
            self.objects.setdefault(key, {})[meta["name"]] = stored
        return stored

    def stored(self, resource: str) -> dict[str, dict]:
        return {
            n: o
            for (_, _, r), objs in self.objects.items()
            if r == resource
            for n, o in objs.items()
        }

    def sent(self, method: str, resource: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and resource in r.path]

    def kubeconfig(self, namespace: str = "default") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "me", "user": {"token": "t"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "me", "namespace": namespace},
                }
            ],
        }

    # --- the REST side -------------------------------------------------------------------
    def handle(self, req: Request) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(req)
        if req.path.rstrip("/") == "/version":
            if (req.method, "version") in self.refuse:
                return _status(*self.refuse[(req.method, "version")])
            major, minor = self.kube_version.lstrip("v").split(".")[:2]
            return 200, {"major": major, "minor": minor, "gitVersion": self.kube_version}
        parts = req.path.strip("/").split("/")
        # api/v1/namespaces/NS/RES[/NAME[/status]] or apis/G/V/namespaces/NS/RES[/NAME[/status]]
        at = 2 if parts[0] == "api" else 3
        if len(parts) < at + 3 or parts[at] != "namespaces":
            return _status(404, f"the fake serves no {req.path}")
        group, ns, res = "/".join(parts[:at]), parts[at + 1], parts[at + 2]
        name = parts[at + 3] if len(parts) > at + 3 else None
        if (req.method, res) in self.refuse:
            return _status(*self.refuse[(req.method, res)])
        with self._lock:
            bucket = self.objects.setdefault((group, ns, res), {})
            return self._rest(req, group, ns, res, name, bucket)

    def _invalid(self, obj: dict) -> str | None:
        """Why the API server would refuse `obj`, by its OpenAPI schema (kubernetes-validate,
        strict: an unknown field is an error), at this server's minor version."""
        version = ".".join(self.kube_version.lstrip("v").split(".")[:2])
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            self.invalid.append(obj)
            return f"{obj.get('kind')} is invalid: {'.'.join(map(str, err.path))}: {err.message}"
        return None

    def _hook(self, hook: Callable[[dict], None], obj: dict) -> None:
        try:
            hook(copy.deepcopy(obj))
        except BaseException as err:  # noqa: BLE001 (kept for the test to see)
            self.hook_errors.append(err)

    def _rest(self, req, group, ns, res, name, bucket) -> tuple[int, Any]:
        kind = KIND_OF.get(res, res)
        if req.method == "GET" and name is None:
            sel = dict(
                p.split("=", 1) for p in req.query.get("labelSelector", [""])[0].split(",") if p
            )
            items = [
                o
                for o in bucket.values()
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())
            ]
            return 200, {
                "apiVersion": group.split("/", 1)[1],
                "kind": f"{kind}List",
                "metadata": {"resourceVersion": "1"},
                "items": items,
            }
        if req.method == "POST":
            obj = copy.deepcopy(req.body)
            problem = self._invalid(obj)
            if problem:  # as the API server's own validation refuses it
                return _status(422, problem, "Invalid")
            n = obj["metadata"]["name"]
            if n in bucket:
                return _status(409, f'{res} "{n}" already exists', "AlreadyExists")
            obj["metadata"].update(
                namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1"
            )
            bucket[n] = obj
            hook = self.on_create.get(res)
            if hook:
                threading.Thread(target=self._hook, args=(hook, obj), daemon=True).start()
            return 201, obj
        if name not in bucket:
            return _status(404, f'{res} "{name}" not found', "NotFound")
        if req.method == "GET":
            return 200, bucket[name]
        if req.method == "DELETE":
            del bucket[name]
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        if req.method == "PATCH":
            bucket[name] = _patched(bucket[name], req.body, req.content_type)
            return 200, bucket[name]
        return _status(405, f"the fake does not {req.method}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, message: str, reason: str = "") -> tuple[int, dict]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _patched(obj: dict, patch: Any, content_type: str) -> dict:
    out = copy.deepcopy(obj)
    if "json-patch" in content_type:
        for op in patch:
            assert op["op"] in ("add", "replace"), op
            *path, last = op["path"].strip("/").split("/")
            target = out
            for p in path:
                target = target.setdefault(p, {})
            target[last] = op["value"]
        return out

    def merge(a: dict, b: dict) -> dict:
        for k, v in b.items():
            a[k] = merge(a.get(k) or {}, v) if isinstance(v, dict) else v
        return a

    return merge(out, patch)


def _handler(fake: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlparse(self.path)
            size = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(size) if size else b""
            req = Request(
                self.command,
                url.path,
                parse_qs(url.query),
                json.loads(raw) if raw else None,
                self.headers.get("Content-Type", ""),
            )
            code, body = fake.handle(req)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, *args: object) -> None:
            pass

    return Handler

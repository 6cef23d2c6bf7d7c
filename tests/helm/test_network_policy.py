"""The chart's NetworkPolicies, as data: from the rendered objects, the (caller, callee, port) edges
the policies let through between the release's pods (and from anywhere), compared with the edges
the services' code uses, for the defaults and every ci/ file. Every pod is selected by a policy,
the sandbox sends nothing, and nothing reaches a gRPC port from outside the release unless
networkPolicy.grpcFrom says so.

The expected edges come from two places, each checked against its source:
  - service -> service: the typed clients each service's code imports (`<callee>_svc.client`,
    followed through atgrpo's modules; test_the_callers_table_is_what_the_code_imports), narrowed by
    pool where the code narrows it: a trainer pushes to its own pool's replicas
    (router_svc/clients.py pool_spec: rollout_addresses=services.rollout[pool]), and a rollout
    replica calls another
    pool's replicas only (router_svc/dispatch.py routes_for: the pools it does not serve);
  - the run Job and helm test: the addresses in their rendered commands (`atgrpo status --address`,
    and the run config's router for `atgrpo train --connect`, atgrpo/cli/runner.py drive)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.helm.conftest import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    WORKLOADS,
    of_kind,
    pod_labels,
    pod_spec,
    pools_of,
    rendered,
    template,
    values_of,
)

SERVICES = ("router", "env", "rollout", "trainer", "sandbox")
# Who calls whom, from the services' code (each client module named is imported by the caller).
CALLERS = {
    "router": {"env", "rollout", "trainer"},  # router_svc/clients.py Clients.connect
    "env": {"sandbox"},  # atgrpo/sdk/serve.py build_host (env_svc --sandbox)
    "rollout": {"env", "rollout"},  # rollout_svc/__main__.py build; replica.py RoutedGenerator
    "trainer": {"rollout"},  # trainer_svc/trainer.py push_weights, _sync_replicas
    "sandbox": set(),
}
ANYWHERE = "*"  # a source outside the release, e.g. Prometheus


# ---- the code's side --------------------------------------------------------------------------


def _module_files() -> dict[str, Path]:
    files = {}
    for pkg in ("atgrpo", *(f"{s}_svc" for s in SERVICES)):
        for path in (ROOT / pkg).rglob("*.py"):
            if "_proto" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imports(path: Path, known) -> set[str]:
    """Modules of the project `path` imports, at its top or inside functions (lazy imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found & set(known)


def clients_used(service: str) -> set[str]:
    """The services whose client `<service>_svc` reaches: its modules' imports, followed through
    atgrpo's own modules, never into another service's package but its client module."""
    files = _module_files()
    own = f"{service}_svc"
    todo = [m for m in files if m.split(".")[0] == own and m != f"{own}.client"]
    seen, used = set(), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported in _imports(files[module], files):
            top = imported.split(".")[0]
            if imported == f"{top}.client" and top.endswith("_svc"):
                used.add(top.removesuffix("_svc"))
            elif top == "atgrpo" or top == own:
                todo.append(imported)
    return used


def test_the_callers_table_is_what_the_code_imports():
    assert {s: clients_used(s) for s in SERVICES} == CALLERS


# ---- the rendered chart's side ------------------------------------------------------------------


def pods(objs) -> list[dict]:
    """Every pod template (Deployments, StatefulSets, Jobs, a LeaderWorkerSet's leader) and bare
    Pod (helm test)."""
    return [o for o in objs if o["kind"] in (*WORKLOADS, "LeaderWorkerSet", "Pod")]


def who(labels: dict) -> str:
    """A pod's identity in the edges: its component, and its pool for pool components."""
    comp = labels["app.kubernetes.io/component"]
    return f"{comp}/{labels['atgrpo.dev/pool']}" if "atgrpo.dev/pool" in labels else comp


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector against a pod's labels, as Kubernetes matches them."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _port_names(spec: dict) -> dict:
    """containerPort and name -> name, for the pod's containers."""
    out = {}
    for c in spec["containers"]:
        for p in c.get("ports", []):
            out[p["containerPort"]] = out[p["name"]] = p["name"]
    return out


def _sources(peer: dict, pod_list: list[dict]) -> set[str]:
    """The release pods a `from` peer admits; ANYWHERE for a peer that reaches beyond them."""
    if "podSelector" in peer and "namespaceSelector" not in peer and "ipBlock" not in peer:
        return {who(pod_labels(p)) for p in pod_list if selects(peer["podSelector"], pod_labels(p))}
    return {ANYWHERE}


def allowed_edges(objs) -> set[tuple[str, str, str]]:
    """(source, destination, port name) for every destination port the ingress policies open."""
    pod_list = pods(objs)
    policies = [p for p in of_kind(objs, "NetworkPolicy") if "Ingress" in p["spec"]["policyTypes"]]
    edges = set()
    for dst in pod_list:
        labels, names = pod_labels(dst), _port_names(pod_spec(dst))
        mine = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        assert mine, f"{dst['kind']} {dst['metadata']['name']} is selected by no NetworkPolicy"
        for policy in mine:
            for rule in policy["spec"].get("ingress", []):
                ports = (
                    {names[p["port"]] for p in rule["ports"]}
                    if rule.get("ports")
                    else set(names.values())
                )
                sources = (
                    set().union(*(_sources(peer, pod_list) for peer in rule["from"]))
                    if "from" in rule
                    else {ANYWHERE}
                )
                edges |= {(src, who(labels), port) for src in sources for port in ports}
    return edges


def _status_targets(args: list[str], services: dict[str, str]) -> set[str]:
    """The pods `atgrpo status --address KIND=HOST:PORT ...` reaches, by the Service names."""
    out = set()
    for i, arg in enumerate(args):
        if arg == "--address":
            # <service>.<ns>.svc.<domain>, or <pod>.<headless service>.<ns>.svc.<domain>
            labels = args[i + 1].split("=", 1)[1].rsplit(":", 1)[0].split(".")
            at = labels.index("svc")
            assert labels[at - 1] == NAMESPACE
            out.add(services[labels[at - 2]])
    return out


def expected_edges(objs, values_file: str | None) -> set[tuple[str, str, str]]:
    values = values_of(values_file)
    pools = pools_of(values)
    servers = [
        who(pod_labels(o))
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet", "LeaderWorkerSet")
    ]
    kind = {s: s.split("/")[0] for s in servers}
    pool = {s: s.split("/")[1] if "/" in s else None for s in servers}
    edges = set()
    for src in servers:
        for dst in servers:
            if kind[dst] not in CALLERS[kind[src]]:
                continue
            if kind[src] == "trainer" and pool[dst] != pool[src]:
                continue  # a trainer pushes to its own pool's replicas only
            if kind[src] == kind[dst] == "rollout" and pool[dst] == pool[src]:
                continue  # a replica generates locally for its own pool
            edges.add((src, dst, "grpc"))
    # The run Job and helm test: every address their `atgrpo status` lists; the Job's `atgrpo train
    # --connect` calls the router of the run config.
    services = {
        svc["metadata"]["name"]: who(svc["spec"]["selector"]) for svc in of_kind(objs, "Service")
    }
    for obj in pods(objs):
        me = who(pod_labels(obj))
        if me not in ("run", "test"):
            continue
        spec = pod_spec(obj)
        for c in spec["containers"] + spec.get("initContainers", []):
            words = c.get("args", []) + [w for line in c.get("command", []) for w in line.split()]
            edges |= {(me, dst, "grpc") for dst in _status_targets(words, services)}
            if c.get("args", [])[:2] == ["atgrpo", "train"]:
                edges.add((me, "router", "grpc"))
    # A trainer past one node: its pods reach each other on every port (torchrun's rendezvous,
    # the collectives' connections).
    for obj in of_kind(objs, "LeaderWorkerSet"):
        me = who(pod_labels(obj))
        edges |= {(me, me, port) for port in set(_port_names(pod_spec(obj)).values())}
    # Prometheus, from wherever networkPolicy.metricsFrom says (anywhere by default).
    assert not values["networkPolicy"]["metricsFrom"]
    edges |= {(ANYWHERE, s, "metrics") for s in servers}
    assert {s.split("/")[1] for s in servers if "/" in s} == set(pools)
    return edges


def test_policies_allow_exactly_the_edges_the_services_use(case):
    values_file, objs = case
    got, want = allowed_edges(objs), expected_edges(objs, values_file)
    assert got - want == set(), "allowed but never used"
    assert want - got == set(), "used but not allowed"
    # nothing from outside the release reaches a gRPC (or health) port
    assert not {e for e in got if e[0] == ANYWHERE and e[2] != "metrics"}


def test_the_edges_by_hand_for_two_pools():
    """The L3 case written out: a planner pool and a coder pool."""
    objs = rendered(str(CHART / "ci" / "l3-two-gpu-pools-values.yaml"))
    grpc = {(s, d) for s, d, p in allowed_edges(objs) if p == "grpc"}
    services = {
        "router",
        "env",
        "sandbox",
        "rollout/planner",
        "rollout/coder",
        "trainer/planner",
        "trainer/coder",
    }
    assert grpc == {
        ("router", "env"),
        ("router", "rollout/planner"),
        ("router", "rollout/coder"),
        ("router", "trainer/planner"),
        ("router", "trainer/coder"),
        ("trainer/planner", "rollout/planner"),
        ("trainer/coder", "rollout/coder"),
        ("rollout/planner", "env"),
        ("rollout/coder", "env"),
        ("rollout/planner", "rollout/coder"),
        ("rollout/coder", "rollout/planner"),
        ("env", "sandbox"),
        *{(client, s) for client in ("run", "test") for s in services},
    }


def test_every_pod_is_selected_and_the_sandbox_sends_nothing(case):
    _, objs = case
    policies = of_kind(objs, "NetworkPolicy")
    for obj in pods(objs):
        assert any(selects(p["spec"]["podSelector"], pod_labels(obj)) for p in policies), obj[
            "metadata"
        ]["name"]
    egress = [p for p in policies if "Egress" in p["spec"]["policyTypes"]]
    assert [who(p["spec"]["podSelector"]["matchLabels"]) for p in egress] == ["sandbox"]
    assert egress[0]["spec"]["egress"] == []  # no rule: nothing may leave, not even DNS
    # the release's selectors name the chart too: a parent chart's other pods share the instance
    # label
    for p in policies:
        assert p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == RELEASE
        assert p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "atgrpo"


def _peers(objs, name: str, port: str) -> list[dict]:
    [policy] = [p for p in of_kind(objs, "NetworkPolicy") if p["metadata"]["name"] == name]
    return [
        peer
        for rule in policy["spec"]["ingress"]
        if {"port": port, "protocol": "TCP"} in rule["ports"]
        for peer in rule.get("from", [{}])
    ]


def test_metrics_and_extra_grpc_sources_are_configurable(helm, tmp_path):
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    laptop = {"ipBlock": {"cidr": "10.1.2.3/32"}}
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump({"networkPolicy": {"metricsFrom": [prometheus], "grpcFrom": [laptop]}})
    )
    objs = template("-f", str(path))
    for name in ("router", "env", "sandbox", "rollout-main", "trainer-main"):
        assert _peers(objs, f"{RELEASE}-atgrpo-{name}", "metrics") == [prometheus]
        assert laptop in _peers(objs, f"{RELEASE}-atgrpo-{name}", "grpc")


def test_no_callers_means_no_grpc_rule_not_an_open_one(helm):
    """Without the run Job and helm test nothing in the release calls the router: its gRPC port
    then has no rule at all (a rule without `from` would admit everyone)."""
    objs = template("--set", "run.enabled=false", "--set", "tests.enabled=false")
    assert _peers(objs, f"{RELEASE}-atgrpo-router", "grpc") == []
    assert "router" not in {d for s, d, p in allowed_edges(objs) if p == "grpc"}


@pytest.mark.parametrize(
    "values, names",
    [
        ({"networkPolicy": {"enabled": False}}, {"sandbox"}),
        (
            {"networkPolicy": {"enabled": False}, "sandbox": {"networkPolicy": {"enabled": False}}},
            set(),
        ),
        (
            {"sandbox": {"networkPolicy": {"enabled": False}}},
            {"default-deny", "router", "env", "rollout-main", "trainer-main"},
        ),
    ],
)
def test_switches(helm, tmp_path, values, names):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    got = {
        p["metadata"]["name"].removeprefix(f"{RELEASE}-atgrpo-")
        for p in of_kind(template("-f", str(path)), "NetworkPolicy")
    }
    assert got == names

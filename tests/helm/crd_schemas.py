"""Strict JSON schemas for the custom objects the chart renders (kubernetes-validate ships schemas
for built-in kinds only): the Prometheus Operator's, written from the monitoring.coreos.com/v1
API reference, and LeaderWorkerSet, from leaderworkerset.x-k8s.io/v1's types
(api/leaderworkerset/v1/leaderworkerset_types.go). The fields listed are real ones with their
types, and anything unknown is rejected, as the API server's structural-schema pruning would
silently drop it. A LeaderWorkerSet's pod templates are core PodTemplateSpecs: the chart test
validates them with kubernetes-validate's own schemas (`pod_templates`)."""

from __future__ import annotations

_STR = {"type": "string"}
_STR_LIST = {"type": "array", "items": _STR}
_STR_MAP = {"type": "object", "additionalProperties": _STR}
_DURATION = {
    "type": "string",
    "pattern": (
        "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
        "(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    ),
}


def _strict(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


_METADATA = _strict(
    {
        "name": {
            "type": "string",
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            "maxLength": 253,
        },
        "namespace": {
            "type": "string",
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "maxLength": 63,
        },
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
    },
    ("name",),
)

_LABEL_SELECTOR = _strict(
    {
        "matchLabels": _STR_MAP,
        "matchExpressions": {
            "type": "array",
            "items": _strict(
                {
                    "key": _STR,
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": _STR_LIST,
                },
                ("key", "operator"),
            ),
        },
    }
)

_NAMESPACE_SELECTOR = _strict({"any": {"type": "boolean"}, "matchNames": _STR_LIST})

_RELABEL = _strict(
    {
        "sourceLabels": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
        },
        "separator": _STR,
        "targetLabel": _STR,
        "regex": _STR,
        "modulus": {"type": "integer"},
        "replacement": _STR,
        "action": {
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ]
        },
    }
)

_ENDPOINT_COMMON = {
    "port": _STR,
    "targetPort": {"type": ["string", "integer"]},
    "path": _STR,
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "params": {"type": "object"},
    "interval": _DURATION,
    "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL},
    "followRedirects": {"type": "boolean"},
    "enableHttp2": {"type": "boolean"},
    "filterRunning": {"type": "boolean"},
    "tlsConfig": {"type": "object"},
    "authorization": {"type": "object"},
    "basicAuth": {"type": "object"},
}

_COMMON_SPEC = {
    "jobLabel": _STR,
    "selector": _LABEL_SELECTOR,
    "namespaceSelector": _NAMESPACE_SELECTOR,
    "podTargetLabels": _STR_LIST,
    "sampleLimit": {"type": "integer", "minimum": 0},
    "targetLimit": {"type": "integer", "minimum": 0},
    "scrapeClass": _STR,
}


def _object(kind: str, spec: dict, api: str = "monitoring.coreos.com/v1") -> dict:
    return _strict(
        {
            "apiVersion": {"const": api},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


SCHEMAS = {
    "ServiceMonitor": _object(
        "ServiceMonitor",
        _strict(
            {
                **_COMMON_SPEC,
                "targetLabels": _STR_LIST,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _strict({**_ENDPOINT_COMMON, "bearerTokenFile": _STR}),
                },
            },
            ("selector", "endpoints"),
        ),
    ),
    "PodMonitor": _object(
        "PodMonitor",
        _strict(
            {
                **_COMMON_SPEC,
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _strict({**_ENDPOINT_COMMON, "portNumber": {"type": "integer"}}),
                },
            },
            ("selector", "podMetricsEndpoints"),
        ),
    ),
    "PrometheusRule": _object(
        "PrometheusRule",
        _strict(
            {
                "groups": {
                    "type": "array",
                    "items": _strict(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "query_offset": _DURATION,
                            "limit": {"type": "integer"},
                            "labels": _STR_MAP,
                            "partial_response_strategy": _STR,
                            "rules": {
                                "type": "array",
                                "items": {
                                    **_strict(
                                        {
                                            "record": _STR,
                                            "alert": _STR,
                                            "expr": {"type": ["string", "integer"]},
                                            "for": _DURATION,
                                            "keep_firing_for": _DURATION,
                                            "labels": _STR_MAP,
                                            "annotations": _STR_MAP,
                                        },
                                        ("expr",),
                                    ),
                                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                                },
                            },
                        },
                        ("name",),
                    ),
                },
            },
            ("groups",),
        ),
    ),
}

_POD_TEMPLATE = {"type": "object"}  # a core PodTemplateSpec: see pod_templates
_INT_OR_STRING = {"type": ["integer", "string"]}
SCHEMAS["LeaderWorkerSet"] = _object(
    "LeaderWorkerSet",
    _strict(
        {
            "replicas": {"type": "integer", "minimum": 0},
            "leaderWorkerTemplate": _strict(
                {
                    "leaderTemplate": _POD_TEMPLATE,
                    "workerTemplate": _POD_TEMPLATE,
                    "size": {"type": "integer", "minimum": 1},
                    "restartPolicy": {
                        "enum": [
                            "Default",
                            "RecreateGroupOnPodRestart",
                            "RecreateGroupAfterStart",
                            "None",
                        ]
                    },
                    "subGroupPolicy": _strict(
                        {
                            "subGroupPolicyType": {"enum": ["LeaderWorker", "LeaderExcluded"]},
                            "subGroupSize": {"type": "integer", "minimum": 1},
                        }
                    ),
                    "volumeClaimTemplates": {"type": "array", "items": {"type": "object"}},
                },
                ("workerTemplate",),
            ),
            "rolloutStrategy": _strict(
                {
                    "type": {"enum": ["RollingUpdate"]},
                    "rollingUpdateConfiguration": _strict(
                        {
                            "partition": {"type": "integer", "minimum": 0},
                            "maxUnavailable": _INT_OR_STRING,
                            "maxSurge": _INT_OR_STRING,
                        }
                    ),
                },
                ("type",),
            ),
            "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
            "networkConfig": _strict(
                {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}}, ("subdomainPolicy",)
            ),
        },
        ("leaderWorkerTemplate",),
    ),
    api="leaderworkerset.x-k8s.io/v1",
)


# KEDA's ScaledObject (keda.sh/v1alpha1), the fields the chart writes, from KEDA's
# apis/keda/v1alpha1/scaledobject_types.go: a scale target, replica bounds and triggers.
SCHEMAS["ScaledObject"] = _object(
    "ScaledObject",
    _strict(
        {
            "scaleTargetRef": _strict(
                {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": _STR},
                ("name",),
            ),
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": _strict(
                    {
                        "type": _STR,
                        "name": {"type": "string"},
                        # every trigger's metadata is a map of strings (KEDA parses them)
                        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    ("type", "metadata"),
                ),
            },
        },
        ("scaleTargetRef", "triggers"),
    ),
    api="keda.sh/v1alpha1",
)


def pod_templates(obj: dict) -> list[dict]:
    """The pod templates a custom object embeds, each as a core v1 PodTemplate object that
    kubernetes-validate checks strictly (named after the object and the template's field)."""
    if obj["kind"] != "LeaderWorkerSet":
        return []
    lwt = obj["spec"]["leaderWorkerTemplate"]
    return [
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{obj['metadata']['name']}-{key.lower()}"},
            "template": lwt[key],
        }
        for key in ("leaderTemplate", "workerTemplate")
        if key in lwt
    ]

"""Protobuf <-> atgrpo.contract.service."""

from __future__ import annotations

from atgrpo._proto.v1 import common_pb2
from atgrpo.contract.service import ServiceInfo


def service_info_from_pb(m: common_pb2.ServiceInfo) -> ServiceInfo:
    return ServiceInfo(m.service, m.version, m.instance, m.started_unix_ms, dict(m.details))

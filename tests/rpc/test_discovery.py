"""atgrpo.discovery: static addresses pass through, dns:/// names expand to every replica."""

from __future__ import annotations

import asyncio
import socket

import pytest

from atgrpo.contract.address import DiscoveryError, Target, format_address, parse_target
from atgrpo.discovery import (
    ReplicaResolver,
    resolve,
    system_lookup,
    wait_for_replicas,
)

HEADLESS = "dns:///atgrpo-rollout-main.ml.svc.cluster.local:50051"


class FakeDNS:
    """A resolver whose records the test sets; counts lookups per host."""

    def __init__(self, records: dict[str, list[str]]):
        self.records = records
        self.calls: list[str] = []

    async def __call__(self, host: str) -> list[str]:
        self.calls.append(host)
        return list(self.records.get(host, []))


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    "text, want",
    [
        ("rollout-0.rollout:50051", Target("rollout-0.rollout", 50051, False)),
        ("127.0.0.1:7000", Target("127.0.0.1", 7000, False)),
        ("[fd00::1]:50051", Target("fd00::1", 50051, False)),
        (HEADLESS, Target("atgrpo-rollout-main.ml.svc.cluster.local", 50051, True)),
        ("dns:///[fd00::2]:9", Target("fd00::2", 9, True)),
    ],
)
def test_parse_target(text, want):
    assert parse_target(text) == want


def test_parse_target_default_port():
    assert parse_target("dns:///svc.ns", default_port=50051) == Target("svc.ns", 50051, True)


@pytest.mark.parametrize(
    "text, message",
    [
        ("svc.ns", "no port"),
        ("svc:0", "not a number in 1-65535"),
        ("svc:http", "not a number in 1-65535"),
        ("dns://8.8.8.8/svc:1", "only the dns:/// scheme"),
        ("http://svc:1", "only the dns:/// scheme"),
        ("fd00::1:50051", "IPv6 address in brackets"),
        ("[fd00::1", "IPv6 address in brackets"),
        (":50051", "no host"),
    ],
)
def test_parse_target_rejects_with_a_fix(text, message):
    with pytest.raises(DiscoveryError, match=message):
        parse_target(text)


def test_format_address_brackets_ipv6():
    assert format_address("10.0.0.1", 1) == "10.0.0.1:1"
    assert format_address("fd00::1", 1) == "[fd00::1]:1"


def test_static_addresses_pass_through_without_lookups():
    dns = FakeDNS({})
    static = ["rollout-main-0.rollout-main.ml.svc.cluster.local:50051", "127.0.0.1:7001"]
    assert run(resolve(static, dns)) == static
    assert dns.calls == []


def test_headless_service_expands_to_every_ready_replica_sorted():
    dns = FakeDNS(
        {
            "atgrpo-rollout-main.ml.svc.cluster.local": [
                "10.0.0.12",
                "10.0.0.3",
                "10.0.0.12",
                "fd00::5",
            ]
        }
    )
    got = run(resolve([HEADLESS], dns))
    # numeric, not text, order (10.0.0.3 before 10.0.0.12); IPv4 before IPv6; no duplicates
    assert got == ["10.0.0.3:50051", "10.0.0.12:50051", "[fd00::5]:50051"]


def test_mixed_static_and_dns_keep_target_order_and_drop_duplicates():
    dns = FakeDNS({"svc": ["10.0.0.2", "10.0.0.1"]})
    got = run(resolve(["10.0.0.2:5", "dns:///svc:5", "other:6"], dns))
    assert got == ["10.0.0.2:5", "10.0.0.1:5", "other:6"]


def test_a_name_without_records_adds_nothing():
    assert run(resolve([HEADLESS], FakeDNS({}))) == []


def test_wait_for_replicas_polls_until_enough_are_ready():
    host = "atgrpo-rollout-main.ml.svc.cluster.local"
    dns = FakeDNS({host: ["10.0.0.1"]})
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        dns.records[host].append(f"10.0.0.{len(dns.records[host]) + 1}")  # one more pod turns ready

    got = run(
        wait_for_replicas([HEADLESS], 3, timeout_s=60, lookup=dns, sleep=sleep, clock=lambda: 0.0)
    )
    assert got == ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
    assert slept == [2.0, 2.0]


def test_wait_for_replicas_times_out_naming_what_it_found():
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    dns = FakeDNS({"atgrpo-rollout-main.ml.svc.cluster.local": ["10.0.0.1"]})
    with pytest.raises(
        DiscoveryError, match=r"1 of 2 rollout replicas ready after 5 s .*10\.0\.0\.1:50051"
    ):
        run(
            wait_for_replicas(
                [HEADLESS], 2, timeout_s=5, lookup=dns, sleep=sleep, clock=lambda: now[0]
            )
        )
    assert now[0] == 6.0  # polled at 0, 2, 4, 6: gave up at the first look past the deadline


def test_resolver_reuses_answers_within_the_ttl_then_sees_changes():
    host = "atgrpo-rollout-main.ml.svc.cluster.local"
    dns = FakeDNS({host: ["10.0.0.1", "10.0.0.2"]})
    now = [100.0]
    resolver = ReplicaResolver([HEADLESS], lookup=dns, ttl_s=5.0, clock=lambda: now[0])
    assert resolver.dynamic
    assert run(resolver.current()) == ["10.0.0.1:50051", "10.0.0.2:50051"]
    dns.records[host] = ["10.0.0.2"]  # replica 1 went away
    now[0] += 4.9
    assert run(resolver.current()) == ["10.0.0.1:50051", "10.0.0.2:50051"]
    assert len(dns.calls) == 1
    now[0] += 0.2
    assert run(resolver.current()) == ["10.0.0.2:50051"]
    assert len(dns.calls) == 2


def test_static_resolver_never_looks_up():
    dns = FakeDNS({})
    resolver = ReplicaResolver(["a:1", "b:2"], lookup=dns, clock=lambda: 0.0)
    assert not resolver.dynamic
    assert run(resolver.current()) == ["a:1", "b:2"]
    assert run(resolver.current()) == ["a:1", "b:2"]
    assert dns.calls == []


def test_resolver_rejects_bad_targets_at_construction():
    with pytest.raises(DiscoveryError, match="no port"):
        ReplicaResolver(["dns:///svc"])


def test_system_lookup_resolves_localhost():
    assert "127.0.0.1" in run(system_lookup("localhost"))  # from /etc/hosts: no DNS server asked


def test_system_lookup_treats_nxdomain_as_no_replica(monkeypatch):
    async def nxdomain(self, host, port, **kw):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", nxdomain)
    assert run(system_lookup("atgrpo-rollout-main.ml.svc.cluster.local")) == []

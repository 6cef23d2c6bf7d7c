"""Find a pool's rollout replicas: fixed host:port addresses, or every address behind a DNS name.

On Kubernetes a pool's rollout replicas sit behind a headless Service (helm/atgrpo). Its name
resolves to one A/AAAA record per *ready* replica, so `dns:///<service>.<ns>.svc.<domain>:50051`
names "every replica of the pool that can take work now". We chose that over watching
EndpointSlices with the `kubernetes` client because:

- it needs no API access: no ServiceAccount token in the trainer pod, no RBAC role, no client
  library in the images, and it works the same outside Kubernetes (any DNS, /etc/hosts);
- the cluster DNS is itself fed from the EndpointSlices, so it lists the same ready pods; what
  it adds is a delay of the record TTL (CoreDNS: 5 s by default), far below one training step,
  and the trainer only needs the list when it pushes weights (once per step) or sets up;
- a watch brings a long-lived connection, resync and reconnect logic into every trainer, for
  changes that matter once per step at most.

gRPC's own `dns:///` resolver balances calls over the addresses; a trainer instead must reach
*every* replica (each gets the new weights), so it resolves the name itself, here.

A `file:///abs/path` entry names a file of addresses, one host:port a line (`#` starts a
comment): the list the local launcher keeps for each pool (`atgrpo scale` rewrites it, as
Kubernetes rewrites a headless Service's records), read afresh each time; a missing file lists
no replica. Entries without a scheme pass through unchanged, so a static list (the per-pod
StatefulSet names, or 127.0.0.1 ports) keeps working as before. The router keeps a
`ReplicaResolver` per pool (router_svc.fleet) and hands each trainer the replicas it found.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from atgrpo.contract.address import (
    DNS_SCHEME,
    FILE_SCHEME,
    DiscoveryError,
    format_address,
    parse_target,
)

__all__ = [
    "Lookup",
    "ReplicaResolver",
    "listed_now",
    "read_address_file",
    "resolve",
    "system_lookup",
    "wait_for_replicas",
]

# host -> the IP addresses it resolves to; [] when the name has no address (no ready replica).
Lookup = Callable[[str], Awaitable[list[str]]]


async def system_lookup(host: str) -> list[str]:
    """Every A and AAAA record of `host` (all ready pods of a headless Service); [] if none."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:  # NXDOMAIN: a headless Service with no ready pod has no record
        return []
    return [info[4][0] for info in infos]


def _ip_order(ip: str) -> tuple[int, int, str]:
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return (2, 0, ip)
    return (parsed.version, int(parsed), ip)


def read_address_file(path: str) -> list[str]:
    """The addresses a file lists (one host:port a line, `#` comments); [] when it is missing.
    Each must parse as a static address: a file lists replicas, not further names."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        t = parse_target(entry)
        if t.dns or t.file:
            raise DiscoveryError(f"{path}:{n}: {entry!r}: list host:port addresses only")
        out.append(format_address(t.host, t.port))
    return out


def listed_now(addresses: Sequence[str]) -> list[str]:
    """resolve() without DNS, for a caller outside an event loop: static entries as given, file
    targets expanded (a local run's replicas)."""
    out: list[str] = []
    for a in addresses:
        t = parse_target(a)
        if t.dns:
            raise DiscoveryError(f"{a!r}: listed_now reads files and static addresses, not DNS")
        found = read_address_file(t.file) if t.file else [format_address(t.host, t.port)]
        out += [x for x in found if x not in out]
    return out


async def resolve(
    addresses: Sequence[str], lookup: Lookup = system_lookup, default_port: int | None = None
) -> list[str]:
    """The replica addresses now: static entries as given, each `dns:///` entry expanded to one
    `ip:port` per address (sorted, so every caller sees the same order), each `file://` entry to
    the addresses its file lists, duplicates dropped. Raises DiscoveryError when a target does
    not parse; a DNS name without records, or a missing file, adds nothing."""
    targets = [parse_target(a, default_port) for a in addresses]
    answers = await asyncio.gather(*(lookup(t.host) for t in targets if t.dns))
    found = iter(answers)
    out: list[str] = []
    for t in targets:
        if t.file:
            expanded = read_address_file(t.file)
        elif t.dns:
            expanded = [
                format_address(ip, t.port) for ip in sorted(set(next(found)), key=_ip_order)
            ]
        else:
            expanded = [format_address(t.host, t.port)]
        out += [a for a in expanded if a not in out]
    return out


async def wait_for_replicas(
    addresses: Sequence[str],
    minimum: int,
    timeout_s: float,
    *,
    lookup: Lookup = system_lookup,
    interval_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> list[str]:
    """Resolve until at least `minimum` replicas are listed (e.g. the pool's replica count at
    Setup, while rollout pods still load their model); DiscoveryError after `timeout_s`."""
    deadline = clock() + timeout_s
    while True:
        found = await resolve(addresses, lookup)
        if len(found) >= minimum:
            return found
        if clock() >= deadline:
            raise DiscoveryError(
                f"{len(found)} of {minimum} rollout replicas ready after {timeout_s:g} s "
                f"behind {list(addresses)} (found: {found or 'none'}). Check the rollout pods: "
                "kubectl get pods -l app.kubernetes.io/component=rollout"
            )
        await sleep(interval_s)


class ReplicaResolver:
    """`resolve` with answers reused for `ttl_s` (the DNS TTL: asking sooner learns nothing)."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        lookup: Lookup = system_lookup,
        ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for a in addresses:
            parse_target(a)  # fail at construction, not at the first push
        self.addresses = tuple(addresses)
        self._lookup, self._ttl_s, self._clock = lookup, ttl_s, clock
        self._cached: list[str] | None = None
        self._at = 0.0

    @property
    def dynamic(self) -> bool:
        """False when every entry is static: the list never changes, nothing is looked up."""
        return any(a.strip().startswith((DNS_SCHEME, FILE_SCHEME)) for a in self.addresses)

    async def current(self) -> list[str]:
        if self._cached is not None and (
            not self.dynamic or self._clock() - self._at < self._ttl_s
        ):
            return list(self._cached)
        self._cached, self._at = await resolve(self.addresses, self._lookup), self._clock()
        return list(self._cached)

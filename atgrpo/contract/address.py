"""How a service address is written, and what it names: `host:port`, `[v6]:port`,
`dns:///host:port` (every replica behind a DNS name) or `file:///abs/path` (a file of addresses).
The syntax is part of the contract: configs, plans and SetupRequests carry such addresses, and
their converters check them; atgrpo.discovery expands them to replicas."""

from __future__ import annotations

from dataclasses import dataclass

DNS_SCHEME = "dns:///"
FILE_SCHEME = "file://"


class DiscoveryError(ValueError):
    """A target that cannot be parsed, or no replica found where at least one was needed."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    dns: bool
    """true: expand to every address the host resolves to; false: use host:port as given"""
    file: str = ""
    """a file of addresses (file:// targets): expand to the addresses it lists now"""


def parse_target(text: str, default_port: int | None = None) -> Target:
    """`host:port`, `[v6]:port`, or `dns:///host[:port]` (gRPC's naming syntax, no authority)."""
    raw = text.strip()
    if raw.startswith(FILE_SCHEME):
        path = raw[len(FILE_SCHEME) :]
        if not path.startswith("/"):
            raise DiscoveryError(
                f"{text!r}: a file target needs an absolute path, e.g. file:///run/replicas.txt"
            )
        return Target("", 0, False, path)
    dns = raw.startswith(DNS_SCHEME)
    rest = raw[len(DNS_SCHEME) :] if dns else raw
    if not dns and "://" in rest:
        raise DiscoveryError(
            f"{text!r}: only the dns:/// scheme is understood (write "
            "dns:///host:port with three slashes), or give host:port"
        )
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            raise DiscoveryError(
                f"{text!r}: write an IPv6 address in brackets, e.g. [fd00::1]:50051"
            )
        port_text = tail[1:]
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    elif ":" in rest:
        raise DiscoveryError(f"{text!r}: write an IPv6 address in brackets, e.g. [{rest}]:50051")
    else:
        host, port_text = rest, ""
    if not host or "/" in host:
        raise DiscoveryError(
            f"{text!r}: no host. Write host:port, e.g. 'rollout-main-0.rollout-main:50051' "
            "or 'dns:///rollout-main.atgrpo.svc.cluster.local:50051'"
        )
    if not port_text:
        if default_port is None:
            raise DiscoveryError(f"{text!r}: no port. Add one, e.g. {host}:50051")
        return Target(host, default_port, dns)
    if not port_text.isdecimal() or not 1 <= int(port_text) <= 65535:
        raise DiscoveryError(f"{text!r}: port {port_text!r} is not a number in 1-65535")
    return Target(host, int(port_text), dns)


def format_address(host: str, port: int) -> str:
    """host:port, with IPv6 literals in brackets as gRPC wants them."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

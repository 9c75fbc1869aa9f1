"""Addresses named up front or discovered through DNS (pure core).

A target list (a kvstore's --scheduler, a scheduler's --peers) is
comma-separated entries, each one of:

- `HOST:PORT`: one address, dialled as given (a name in it is resolved by
  gRPC on each connection, to one replica at a time);
- `dns:NAME:PORT`, or `dns:///NAME:PORT`: every address NAME resolves to, at
  PORT, re-resolved periodically (discovery_watch.py). The spelling is
  gRPC's own dns resolver target (`dns:[//authority/]host[:port]`, gRPC's
  naming doc) without an authority: the system resolver answers, so a
  Kubernetes headless Service gives every ready (or, with
  publishNotReadyAddresses, every) pod IP and a compose network alias every
  container's. The port is required (gRPC's default, 443, is never ours).

Membership tracks what successive resolutions returned. An address joins at
the first resolution that lists it and leaves once every successful
resolution for `grace_s` seconds has left it out, so a name that briefly
resolves to fewer addresses (an endpoints update under way) closes nothing.
A failed resolution changes nothing: a DNS outage must not drop links that
still work. Addresses in `exclude` (this process's own) never join.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from speckv.services.common.clock import Clock
from speckv.services.common.errors import InvalidArgument

DNS_SCHEME = "dns:"


@dataclass(frozen=True, slots=True)
class DnsName:
    """A `dns:` entry: the name to resolve and the port every address gets."""
    name: str
    port: int

    def __str__(self) -> str:
        return f"{DNS_SCHEME}{self.name}:{self.port}"


@dataclass(frozen=True, slots=True)
class Targets:
    """A parsed target list: static addresses in their order, and the DNS names."""
    static: tuple[str, ...] = ()
    names: tuple[DnsName, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.static and not self.names


def parse_targets(spec: str | Sequence[str], what: str = "targets") -> Targets:
    """spec: comma-separated entries (or a list of them); blanks and repeats
    are dropped. InvalidArgument names `what` and the bad entry."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    static: list[str] = []
    names: list[DnsName] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if part.startswith(DNS_SCHEME):
            name = parse_dns(part, what)
            if name not in names:
                names.append(name)
        elif ":" not in part:
            raise InvalidArgument(f"{what}: {part!r}: expected host:port or dns:NAME:PORT")
        elif part not in static:
            static.append(part)
    return Targets(tuple(static), tuple(names))


def parse_dns(entry: str, what: str = "targets") -> DnsName:
    """`dns:NAME:PORT` or `dns:///NAME:PORT` (NAME may be a bracketed IPv6 literal)."""
    rest = entry[len(DNS_SCHEME):]
    if rest.startswith("//"):
        authority, slash, rest = rest[2:].partition("/")
        if authority or not slash:
            raise InvalidArgument(f"{what}: {entry!r}: a DNS server authority is not supported; write "
                                  "dns:NAME:PORT (the system resolver answers)")
    host, colon, port_text = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or "/" in host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"{what}: {entry!r}: expected dns:NAME:PORT with a port in 1..65535")
    return DnsName(host, int(port_text))


def join_host_port(host: str, port: int) -> str:
    """host:port, with an IPv6 literal in brackets (gRPC's address form)."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass  # a name
    return f"{host}:{port}"


def split_host_port(address: str, what: str = "address") -> tuple[str, int]:
    """The inverse of join_host_port; InvalidArgument (naming `what`) without a numeric port."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit():
        raise InvalidArgument(f"{what}={address!r}: expected host:port")
    return (host[1:-1] if host.startswith("[") and host.endswith("]") else host), int(port)


@dataclass(frozen=True, slots=True)
class Changes:
    """What one update did to the members: addresses that joined, that left."""
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass(slots=True)
class _NameRecord:
    # address -> when successful resolutions started leaving it out (None: in the last one)
    missing_since: dict[str, float | None] = field(default_factory=dict)


class Membership:
    """The members of a Targets over time (module docstring). Not thread-safe:
    one owner (the watcher thread) updates it; readers get the tuples it returns."""

    def __init__(self, targets: Targets, clock: Clock, grace_s: float, exclude: Iterable[str] = ()) -> None:
        if grace_s < 0:
            raise InvalidArgument(f"grace_s={grace_s}: must be >= 0")
        self._exclude = frozenset(exclude)
        self._static = tuple(a for a in targets.static if a not in self._exclude)
        self._records = {name: _NameRecord() for name in targets.names}
        self._clock, self._grace_s = clock, grace_s

    def members(self) -> tuple[str, ...]:
        """Static addresses first, in their order, then discovered ones sorted (each once)."""
        discovered = {a for record in self._records.values() for a in record.missing_since}
        return self._static + tuple(sorted(discovered - set(self._static)))

    def resolved(self, name: DnsName, addresses: Iterable[str]) -> Changes:
        """A successful resolution of name (addresses as host:port, the port already name.port)."""
        before = self.members()
        now = self._clock.now()
        seen = {a for a in addresses if a not in self._exclude}
        record = self._records[name]
        for address in seen:
            record.missing_since[address] = None
        for address, since in list(record.missing_since.items()):
            if address in seen:
                continue
            if since is None:
                record.missing_since[address] = since = now
            if now - since >= self._grace_s:
                del record.missing_since[address]
        return _diff(before, self.members())


def _diff(before: Sequence[str], after: Sequence[str]) -> Changes:
    old, new = set(before), set(after)
    return Changes(tuple(a for a in after if a not in old), tuple(a for a in before if a not in new))

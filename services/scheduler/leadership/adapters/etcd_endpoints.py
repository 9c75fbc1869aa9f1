"""Where etcd is and how to reach it: the members' client URLs (--etcd) and
the TLS files (--etcd-ca, --etcd-cert, --etcd-key). Pure: parsing and checks.

- `--etcd` is a comma-separated list of one cluster's members, each
  `http://HOST:PORT`, `https://HOST:PORT` or `HOST:PORT` (http). Every member
  answers every call (etcd forwards to its raft leader), so the client asks
  one and moves to the next when that one fails (etcd_keys.py).
- One scheme for all: a list mixing http and https is refused (a member
  reached in plaintext would leak what the others protect).
- TLS (https only): `ca` is the CA that signed the members' server
  certificates ("" = the system's trust store); `cert` and `key` are this
  client's certificate and key, given together or not at all (etcd run with
  --client-cert-auth refuses a client without one). TLS files beside http
  endpoints are refused: they would silently protect nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

from speckv.services.common.discovery import join_host_port
from speckv.services.common.errors import InvalidArgument

SCHEMES = ("http", "https")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One etcd member's client URL."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.scheme}://{join_host_port(self.host, self.port)}"

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """PEM file paths (module docstring); all empty: the system's CAs, no client certificate."""

    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def empty(self) -> bool:
        return not (self.ca or self.cert or self.key)

    def check(self) -> None:
        """InvalidArgument naming the flag when a file is missing or the pair is half given."""
        if bool(self.cert) != bool(self.key):
            raise InvalidArgument("etcd_cert and etcd_key: give both (this client's certificate and its key) "
                                  "or neither")
        for name, path in (("etcd_ca", self.ca), ("etcd_cert", self.cert), ("etcd_key", self.key)):
            if path and not Path(path).is_file():
                raise InvalidArgument(f"{name}={path}: no such file")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """host and port of one "http[s]://host:port" or "host:port"."""
    parsed = parse_member(endpoint)
    return parsed.host, parsed.port


def parse_member(endpoint: str) -> Endpoint:
    text = endpoint.strip()
    text = text if "://" in text else f"http://{text}"
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise InvalidArgument(f"etcd endpoint {endpoint!r}: expected http://HOST:PORT, https://HOST:PORT or "
                              "HOST:PORT")
    return Endpoint(parts.scheme, parts.hostname, port)


def parse_endpoints(spec: str | Sequence[str], tls: EtcdTls | None = None) -> tuple[Endpoint, ...]:
    """The members of a comma-separated list (or a list of entries), each
    once, in their order; InvalidArgument for an empty list, a bad entry, mixed
    schemes, or TLS files beside http (module docstring)."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    members = tuple(dict.fromkeys(parse_member(p) for p in parts if p.strip()))
    if not members:
        raise InvalidArgument(f"etcd endpoints {spec!r}: none given")
    schemes = {m.scheme for m in members}
    if len(schemes) > 1:
        raise InvalidArgument(f"etcd endpoints {spec!r}: mix http and https; every member is reached the same way")
    if tls is not None and not tls.empty and schemes == {"http"}:
        raise InvalidArgument("etcd_ca, etcd_cert and etcd_key are for https etcd endpoints; the ones given "
                              f"({spec}) are http")
    return members

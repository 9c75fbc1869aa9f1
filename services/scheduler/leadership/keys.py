"""What the election and the shared state need from etcd, as two small
interfaces (the etcd3gw implementation: adapters/etcd_keys.py; an in-memory
one with the same semantics: memory_keys.py), and where the keys live.

Semantics (etcd v3's):
- Every write bumps one cluster-wide revision; a key's create_revision is the
  revision that created it (0: absent), so a key deleted and made again has
  a strictly larger one. The election's epoch is the leader key's
  create_revision: strictly increasing across leaders, a fencing token.
- A lease lives ttl_s seconds past its last keep-alive (the server may grant
  more than asked: it has a minimum); its keys are deleted when it expires
  or is revoked.
- Unreachable etcd raises Unavailable; nothing else is raised for a call
  that reached it.

Layout under /speckv/<cluster>/: `leader` (the leader key: a JSON object of
the leader's replica id and address, on the leader's lease) and `state/...`
(the durable control state: leadership/state_store.py).
"""
from __future__ import annotations

from dataclasses import dataclass
import threading
from typing import Callable, Mapping, Protocol, Sequence

from speckv.services.common.errors import InvalidArgument

LeaseId = int


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as etcd holds it: its value, the revision that created it and
    the lease it lives on (0: none)."""

    value: bytes
    create_revision: int
    lease: LeaseId


@dataclass(frozen=True, slots=True)
class CampaignResult:
    """won: this call created the key; holder: the key after the call (ours
    when won; None only if it vanished between the txn's compare and read,
    which one txn rules out)."""

    won: bool
    holder: KeyRecord | None


class LeaderKeyStore(Protocol):
    """The election's etcd operations."""

    def grant(self, ttl_s: int) -> tuple[LeaseId, int]:
        """A new lease: (its id, the TTL granted in seconds, >= ttl_s)."""
        ...

    def keep_alive(self, lease: LeaseId) -> int:
        """Refreshes lease; its TTL in seconds now, <= 0 when it is gone."""
        ...

    def revoke(self, lease: LeaseId) -> None:
        """Ends lease now, deleting its keys (a lease already gone: no-op)."""
        ...

    def read(self, key: str) -> KeyRecord | None:
        """key as it is now; None when absent."""
        ...

    def campaign(self, key: str, value: bytes, lease: LeaseId) -> CampaignResult:
        """One txn: if key is absent (create_revision == 0) put value on
        lease; either way read key back."""
        ...


class LeaderKeyWatch(Protocol):
    """Being told when the leader key changes, rather than looking each round."""

    def watch(self, key: str, on_change: Callable[[], None], stop: threading.Event) -> None:
        """Blocks until stop is set, calling on_change (on the caller's
        thread) each time key is put or deleted, and also whenever a change
        may have been missed (the watch starting, or restarting after a gap it
        cannot resume across). Never raises for etcd being unreachable: it
        retries until stop; returns within a bounded time of stop being set."""
        ...


class FencedKeyStore(Protocol):
    """The shared state's etcd operations."""

    def write_fenced(self, fence_key: str, epoch: int, puts: Mapping[str, bytes], deletes: Sequence[str]) -> bool:
        """One txn: the puts and deletes when fence_key's create_revision ==
        epoch, nothing otherwise; whether it was applied."""
        ...

    def read_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every key under prefix with its value, by key, in one consistent read."""
        ...


def cluster_root(cluster: str) -> str:
    """/speckv/<cluster>/; a cluster name is one path segment."""
    if not cluster or "/" in cluster or not cluster.isprintable() or cluster != cluster.strip():
        raise InvalidArgument(f"cluster name {cluster!r}: must be a non-empty printable name without '/' "
                              "or surrounding spaces")
    return f"/speckv/{cluster}/"


def leader_key(cluster: str) -> str:
    return cluster_root(cluster) + "leader"


def state_prefix(cluster: str) -> str:
    return cluster_root(cluster) + "state/"

"""MemoryKeys: etcd's semantics for the election and the shared state, in one
process (keys.py's LeaderKeyStore and FencedKeyStore): a cluster-wide
revision bumped by every write, create_revision per key, leases that expire
ttl seconds past their last keep-alive on an injected clock (expiry is
applied at each call, as etcd's lessor would have by then), txns applied
whole or not at all. For the simulator and the unit tests of the election
and the state store; the real etcd runs in tests/services.

Thread-safe (one lock). Never raises Unavailable: it is always reachable.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

from speckv.services.common.clock import Clock
from speckv.services.scheduler.leadership.keys import CampaignResult, KeyRecord, LeaseId

MIN_TTL_S = 2  # what an etcd with default timings grants at least (its minimum lease TTL)


@dataclass(slots=True)
class _Lease:
    ttl: int
    expires_at: float


class MemoryKeys:
    def __init__(self, clock: Clock, min_ttl_s: int = MIN_TTL_S) -> None:
        self._clock = clock
        self._min_ttl = min_ttl_s
        self._lock = threading.Lock()
        self._revision = 1  # etcd starts at 1
        self._next_lease = 0x1000
        self._kv: dict[str, KeyRecord] = {}
        self._leases: dict[LeaseId, _Lease] = {}

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    # --- LeaderKeyStore ------------------------------------------------------
    def grant(self, ttl_s: int) -> tuple[LeaseId, int]:
        with self._lock:
            self._expire()
            ttl = max(ttl_s, self._min_ttl)
            lease = self._next_lease
            self._next_lease += 1
            self._leases[lease] = _Lease(ttl, self._clock.now() + ttl)
            return lease, ttl

    def keep_alive(self, lease: LeaseId) -> int:
        with self._lock:
            self._expire()
            held = self._leases.get(lease)
            if held is None:
                return -1
            held.expires_at = self._clock.now() + held.ttl
            return held.ttl

    def revoke(self, lease: LeaseId) -> None:
        with self._lock:
            self._expire()
            if self._leases.pop(lease, None) is not None:
                self._delete_lease_keys(lease)

    def read(self, key: str) -> KeyRecord | None:
        with self._lock:
            self._expire()
            return self._kv.get(key)

    def campaign(self, key: str, value: bytes, lease: LeaseId) -> CampaignResult:
        with self._lock:
            self._expire()
            if key in self._kv:
                return CampaignResult(False, self._kv[key])
            if lease not in self._leases:
                raise ValueError(f"lease {lease:x} not found")  # etcd: "requested lease not found"
            self._revision += 1
            self._kv[key] = KeyRecord(bytes(value), self._revision, lease)
            return CampaignResult(True, self._kv[key])

    # --- FencedKeyStore ------------------------------------------------------
    def write_fenced(self, fence_key: str, epoch: int, puts: Mapping[str, bytes], deletes: Sequence[str]) -> bool:
        with self._lock:
            self._expire()
            if len(set(puts) | set(deletes)) != len(puts) + len(deletes):
                raise ValueError("duplicate key given in txn request")  # as etcd refuses it
            fence = self._kv.get(fence_key)
            if (fence.create_revision if fence else 0) != epoch:
                return False
            if not puts and not deletes:
                return True
            self._revision += 1
            for key, value in puts.items():
                old = self._kv.get(key)
                self._kv[key] = KeyRecord(bytes(value), old.create_revision if old else self._revision, 0)
            for key in deletes:
                self._kv.pop(key, None)
            return True

    def read_prefix(self, prefix: str) -> list[tuple[str, bytes]]:
        with self._lock:
            self._expire()
            return sorted((k, r.value) for k, r in self._kv.items() if k.startswith(prefix))

    # --- etcd's lessor -------------------------------------------------------
    def _expire(self) -> None:
        now = self._clock.now()
        for lease in [lease for lease, held in self._leases.items() if now >= held.expires_at]:
            del self._leases[lease]
            self._delete_lease_keys(lease)

    def _delete_lease_keys(self, lease: LeaseId) -> None:
        gone = [key for key, record in self._kv.items() if record.lease == lease]
        if gone:
            self._revision += 1
        for key in gone:
            del self._kv[key]

"""Which blocks on which node are speculative replicas, and whether any
request read them: the source of the replica hit ratio and wasted bytes.

Fed with the kvstores' KV events (COMMITTED = a block landed by a
replication order; STORED = computed or pulled by the node itself; REMOVED =
evicted; SNAPSHOT = full inventory, origin unknown so treated as local) and
with every request's cached prefix on the node that served it.

Invariants: a (node, hash) is a replica from its COMMITTED event until it is
removed; it stays one when the node later stores the same hash (a put of a
present hash changes nothing). A replica is *read* when a request served on
that node had it in its cached prefix; a replica removed or left at the end
never read is *wasted*. Counts are blocks; bytes = blocks x bytes_per_block.
Not thread-safe: the caller serialises.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Iterable


class KVEventKind(enum.Enum):
    STORED = "stored"
    REMOVED = "removed"
    COMMITTED = "committed"
    SNAPSHOT = "snapshot"


@dataclass(slots=True)
class _Replica:
    order_id: str
    family: str
    committed_s: float
    reads: int = 0


@dataclass(slots=True)
class ReplicaFate:
    """One replication order's landing on one node: what it committed and
    when (caller's time axis, s), and when a request first read any of it
    (None: never read, or read without a time)."""

    order_id: str
    node: str
    family: str
    committed_s: float
    blocks: int
    read_blocks: int = 0
    first_read_s: float | None = None


@dataclass(slots=True)
class ReplicaTotals:
    committed_blocks: int = 0
    read_blocks: int = 0  # replicas read at least once
    wasted_blocks: int = 0  # removed, or still there at the end, never read
    open_blocks: int = 0  # still resident and unread (counted as wasted by totals())
    commits: list[tuple[float, int, str]] = field(default_factory=list)  # (time_s, blocks, family)
    fates: list[ReplicaFate] = field(default_factory=list)  # one per (order, node) that committed fresh blocks


class ReplicaLedger:
    def __init__(self) -> None:
        self._replicas: dict[str, dict[int, _Replica]] = {}  # node -> hash -> replica (no tuple key per block)
        self._totals = ReplicaTotals()
        self._fates: dict[tuple[str, str], ReplicaFate] = {}  # (order id, node)

    def apply(self, node: str, kind: KVEventKind, hashes: Iterable[int], time_s: float,
              order_id: str = "", family: str = "") -> None:
        if kind is KVEventKind.COMMITTED:
            held = self._replicas.setdefault(node, {})
            fresh = [h for h in hashes if h not in held]
            for h in fresh:
                held[h] = _Replica(order_id, family, time_s)
            self._totals.committed_blocks += len(fresh)
            if fresh:
                self._totals.commits.append((time_s, len(fresh), family))
                fate = self._fates.setdefault((order_id, node), ReplicaFate(order_id, node, family, time_s, 0))
                fate.blocks += len(fresh)
        elif kind is KVEventKind.REMOVED:
            removed_from = self._replicas.get(node)
            if removed_from:  # every eviction of every node comes here; most nodes hold no replica
                for h in hashes:
                    self._retire(removed_from.pop(h, None))
        elif kind is KVEventKind.SNAPSHOT:
            resident = self._replicas.get(node, {})
            keep = set(hashes)
            for h in [h for h in resident if h not in keep]:
                self._retire(resident.pop(h))

    def note_read(self, node: str, cached_hashes: Iterable[int], time_s: float | None = None) -> int:
        """Records that a request on `node` (arriving at time_s; None: not
        known, no first-read time is kept) used these cached blocks; returns
        how many of them were replicas."""
        held = self._replicas.get(node)
        if not held:
            return 0
        used = 0
        for h in cached_hashes:
            replica = held.get(h)
            if replica is not None:
                fate = self._fates.get((replica.order_id, node))
                if replica.reads == 0:
                    self._totals.read_blocks += 1
                    if fate is not None:
                        fate.read_blocks += 1
                if fate is not None and fate.first_read_s is None and time_s is not None:
                    fate.first_read_s = time_s
                replica.reads += 1
                used += 1
        return used

    def totals(self) -> ReplicaTotals:
        """Totals so far; replicas still resident and unread count as wasted
        (the run is over when this is read for the report)."""
        open_unread = sum(1 for held in self._replicas.values() for r in held.values() if r.reads == 0)
        t = self._totals
        fates = [dataclasses.replace(f) for f in self._fates.values()]
        return ReplicaTotals(t.committed_blocks, t.read_blocks, t.wasted_blocks + open_unread, open_unread,
                             list(t.commits), fates)

    def _retire(self, replica: _Replica | None) -> None:
        if replica is not None and replica.reads == 0:
            self._totals.wasted_blocks += 1

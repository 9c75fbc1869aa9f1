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
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._totals = ReplicaTotals()
        self._fates: dict[tuple[str, str], ReplicaFate] = {}  # (order id, node)

    def apply(self, node: str, kind: KVEventKind, hashes: Iterable[int], time_s: float,
              order_id: str = "", family: str = "") -> None:
        hashes = list(hashes)
        if kind is KVEventKind.COMMITTED:
            fresh = [h for h in hashes if (node, h) not in self._replicas]
            for h in fresh:
                self._replicas[(node, h)] = _Replica(order_id, family, time_s)
            self._totals.committed_blocks += len(fresh)
            if fresh:
                self._totals.commits.append((time_s, len(fresh), family))
                fate = self._fates.setdefault((order_id, node), ReplicaFate(order_id, node, family, time_s, 0))
                fate.blocks += len(fresh)
        elif kind is KVEventKind.REMOVED:
            for h in hashes:
                self._retire(self._replicas.pop((node, h), None))
        elif kind is KVEventKind.SNAPSHOT:
            keep = set(hashes)
            for key in [k for k in self._replicas if k[0] == node and k[1] not in keep]:
                self._retire(self._replicas.pop(key))

    def note_read(self, node: str, cached_hashes: Iterable[int], time_s: float | None = None) -> int:
        """Records that a request on `node` (arriving at time_s; None: not
        known, no first-read time is kept) used these cached blocks; returns
        how many of them were replicas."""
        used = 0
        for h in cached_hashes:
            replica = self._replicas.get((node, h))
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
        open_unread = sum(1 for r in self._replicas.values() if r.reads == 0)
        t = self._totals
        fates = [dataclasses.replace(f) for f in self._fates.values()]
        return ReplicaTotals(t.committed_blocks, t.read_blocks, t.wasted_blocks + open_unread, open_unread,
                             list(t.commits), fates)

    def _retire(self, replica: _Replica | None) -> None:
        if replica is not None and replica.reads == 0:
            self._totals.wasted_blocks += 1

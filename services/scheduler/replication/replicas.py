"""Speculative replicas the scheduler placed, from commit to lease end.

A replica is born when its order commits: family, target node, the blocks
and bytes copied, and a lease ending `lease_ms` after the commit (the same
lease the target kvstore holds it under). A route that sends a request of the
family to the node while the lease runs marks it *used*. When the lease ends:
- used: the blocks are ordinary cache now (the kvstore clears the lease on
  first use); the ledger drops the record (counted as `kept`).
- unused: the replica is *released*: the ledger drops it, its pages stop
  counting against the node's replica memory budget, and its bytes count as
  wasted. The kvstore evicts expired-lease replicas before anything else, so
  the pages really come back under pressure.

Stats are cumulative. Not thread-safe: SchedulerCore serialises access.
Times are clock seconds.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from speckv.services.common.ids import Family, NodeId, OrderId


@dataclass(slots=True)
class Replica:
    order_id: OrderId
    family: Family
    node: NodeId
    blocks: int
    nbytes: int
    committed_at: float
    lease_end: float
    used: bool = False


@dataclass(slots=True)
class ReplicaStats:
    committed: int = 0
    kept: int = 0  # used before the lease ended
    released_unused: int = 0
    bytes_committed: int = 0
    bytes_wasted: int = 0


@dataclass(slots=True)
class LeasedReplicas:
    _by_key: dict[tuple[Family, NodeId], list[Replica]] = field(default_factory=lambda: defaultdict(list))
    _blocks_on: dict[NodeId, int] = field(default_factory=lambda: defaultdict(int))
    stats: ReplicaStats = field(default_factory=ReplicaStats)

    def add(self, replica: Replica) -> None:
        self._by_key[(replica.family, replica.node)].append(replica)
        self._blocks_on[replica.node] += replica.blocks
        self.stats.committed += 1
        self.stats.bytes_committed += replica.nbytes

    def mark_used(self, family: Family, node: NodeId) -> None:
        for replica in self._by_key.get((family, node), ()):
            replica.used = True

    def expire(self, now: float) -> list[Replica]:
        """Ends every lease that is over; returns the unused replicas released."""
        released: list[Replica] = []
        for key in [k for k, rs in self._by_key.items() if any(r.lease_end <= now for r in rs)]:
            keep = []
            for replica in self._by_key[key]:
                if replica.lease_end > now:
                    keep.append(replica)
                    continue
                self._blocks_on[replica.node] -= replica.blocks
                if replica.used:
                    self.stats.kept += 1
                else:
                    self.stats.released_unused += 1
                    self.stats.bytes_wasted += replica.nbytes
                    released.append(replica)
            if keep:
                self._by_key[key] = keep
            else:
                del self._by_key[key]
        return released

    def drop_node(self, node: NodeId) -> None:
        """Forgets node's replicas (it re-registered with an empty pool)."""
        for key in [k for k in self._by_key if k[1] == node]:
            del self._by_key[key]
        self._blocks_on.pop(node, None)

    def blocks_on(self, node: NodeId) -> int:
        """Blocks under a running replica lease on node."""
        return self._blocks_on.get(node, 0)

    def nodes_of(self, family: Family) -> list[NodeId]:
        return [node for (f, node) in self._by_key if f == family]

    def active(self) -> list[Replica]:
        return [r for rs in self._by_key.values() for r in rs]

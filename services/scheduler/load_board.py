"""The k least-loaded live nodes in a few microseconds, for 1,000+ nodes.

Routing must score the holders of a request's prefix plus the least-loaded
nodes that hold none of it: every non-holder has the same prefill cost, so
among them expected TTFT only grows with queueing delay and the least-loaded
ones dominate the rest. Scoring all nodes in a Python loop costs ~1 ms at
1,000 nodes; this board answers from a sorted list instead.

A list of (load_ms, version, node) kept sorted, one entry per listed node:
every load change bumps the version, deletes the node's old entry (found by
bisection) and inserts the new one in order, O(log n) comparisons plus a
memmove of n pointers (a few KB at 1,000 nodes: cheaper than a heap's
sift). A query walks the list from the front until it has k nodes outside
`exclude`: O(k + excluded + skipped), with no reordering, so a query costs
a fraction of the updates it follows. A node found dead (no heartbeat
within timeout_s) is *parked*: its entry is deleted, because only a
heartbeat (`upsert`) can revive it and that inserts a fresh entry. The
order is (load, then the older update first, then node id), which is also
the order the earlier lazy heap gave, so routing decisions did not change.

Invariants: each node has at most one entry in the list, and a listed
node's entry carries its current (load_ms, version); `load_ms` is the
expected queueing delay as last set by the owner (Cluster). Not thread-safe.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import Collection

from speckv.services.common.ids import NodeId


class LoadBoard:
    def __init__(self) -> None:
        self._order: list[tuple[float, int, NodeId]] = []
        self._current: dict[NodeId, tuple[float, int]] = {}  # node -> (load_ms, version), listed or parked
        self._heartbeat: dict[NodeId, float] = {}
        self._version = 0

    def upsert(self, node_id: NodeId, load_ms: float, last_heartbeat: float) -> None:
        self._heartbeat[node_id] = last_heartbeat
        self.set_load(node_id, load_ms)

    def set_load(self, node_id: NodeId, load_ms: float) -> None:
        order = self._order
        old = self._current.get(node_id)
        if old is not None:
            i = bisect_left(order, old)  # (load, version) sorts just before its (load, version, node)
            if i < len(order) and order[i][1] == old[1]:
                del order[i]  # else parked: nothing listed
        self._version += 1
        self._current[node_id] = (load_ms, self._version)
        insort(order, (load_ms, self._version, node_id))

    def least_loaded(self, k: int, now: float, timeout_s: float, exclude: Collection[NodeId] = (),
                     counted: Collection[NodeId] | None = None) -> list[NodeId]:
        """Live nodes not in exclude, least loaded first (ties: older update),
        up to and including the k-th one in `counted` (default: every node
        counts, so exactly the k least loaded)."""
        out: list[NodeId] = []
        order, heartbeat, oldest = self._order, self._heartbeat, now - timeout_s
        found = i = 0
        while i < len(order) and found < k:
            node_id = order[i][2]
            if heartbeat[node_id] < oldest:
                del order[i]  # parked until its next heartbeat
                continue
            i += 1
            if node_id not in exclude:
                out.append(node_id)
                found += counted is None or node_id in counted
        return out

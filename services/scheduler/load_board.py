"""The k least-loaded live nodes in a few microseconds, for 1,000+ nodes.

Routing must score the holders of a request's prefix plus the least-loaded
nodes that hold none of it: every non-holder has the same prefill cost, so
among them expected TTFT only grows with queueing delay and the least-loaded
ones dominate the rest. Scoring all nodes in a Python loop costs ~1 ms at
1,000 nodes; this board answers from a min-heap instead.

A lazy-deletion heap of (load_ms, version, node): every load change pushes a
new entry with a bumped version, and entries whose version is not the node's
current one are discarded when they surface. A query pops until it has k
live nodes outside `exclude`, then pushes the popped current entries back:
O((k + stale + excluded) log n). A node found dead (no heartbeat within
timeout_s) is *parked*: its entry is not pushed back, because only a
heartbeat (`upsert`) can revive it and that pushes a fresh entry. The heap is
rebuilt when stale entries outnumber the nodes (a query pops past them).

Invariants: each node has at most one current entry, in the heap or parked;
`load_ms` is the expected queueing delay as last set by the owner (Cluster).
Not thread-safe.
"""
from __future__ import annotations

import heapq
from typing import Collection

from speckv.services.scheduler.ids import NodeId


class LoadBoard:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, NodeId]] = []
        self._current: dict[NodeId, tuple[float, int]] = {}  # node -> (load_ms, version)
        self._heartbeat: dict[NodeId, float] = {}
        self._version = 0

    def upsert(self, node_id: NodeId, load_ms: float, last_heartbeat: float) -> None:
        self._heartbeat[node_id] = last_heartbeat
        self.set_load(node_id, load_ms)

    def set_load(self, node_id: NodeId, load_ms: float) -> None:
        self._version += 1
        self._current[node_id] = (load_ms, self._version)
        heapq.heappush(self._heap, (load_ms, self._version, node_id))
        if len(self._heap) > 2 * len(self._current) + 64:
            self._rebuild()

    def least_loaded(self, k: int, now: float, timeout_s: float, exclude: Collection[NodeId] = (),
                     counted: Collection[NodeId] | None = None) -> list[NodeId]:
        """Live nodes not in exclude, least loaded first (ties: older entry),
        up to and including the k-th one in `counted` (default: every node
        counts, so exactly the k least loaded)."""
        out: list[NodeId] = []
        keep: list[tuple[float, int, NodeId]] = []
        heap, current, oldest = self._heap, self._current, now - timeout_s
        found = 0
        while heap and found < k:
            entry = heapq.heappop(heap)
            load, version, node_id = entry
            if current.get(node_id, (0.0, -1))[1] != version:
                continue  # stale
            if self._heartbeat[node_id] < oldest:
                continue  # parked until its next heartbeat
            keep.append(entry)
            if node_id not in exclude:
                out.append(node_id)
                found += counted is None or node_id in counted
        for entry in keep:
            heapq.heappush(heap, entry)
        return out

    def _rebuild(self) -> None:
        self._heap = [(load, version, node_id) for node_id, (load, version) in self._current.items()]
        heapq.heapify(self._heap)

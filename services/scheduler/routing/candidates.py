"""Which nodes a route scores: the live holders of the request's first block
plus the `spread` least-queued other live nodes.

Every non-holder costs the same prefill, so the least-queued ones dominate the
rest and the router's choice equals scoring all nodes. When many nodes hold
the first block (a system prompt every request starts with), only the holders
of two or more blocks are walked in full; of the nodes holding just the first
block, and of those holding none, the `spread` least queued are taken: every
skipped node is dominated by a taken one with as much cache and no more queue.

A node ramping after it joined a serving cluster (join_ramp.py) and over its
allowance is left out, unless it holds strictly more of the prefix than
every other candidate; the `spread` least-queued non-holders are then taken
from the rest, so the router still sees as many.
"""
from __future__ import annotations

from typing import Collection

from speckv.services.common.ids import NodeId
from speckv.services.scheduler.cluster import Cluster
from speckv.services.scheduler.holder_index import HolderIndex
from speckv.services.scheduler.routing.disk_backlog import DiskBacklog
from speckv.services.scheduler.routing.join_ramp import JoinRamp
from speckv.services.scheduler.routing.link_backlog import LinkBacklog
from speckv.services.scheduler.routing.router import Candidate


class CandidateSelector:
    """Reads the cluster, the holder index and the link and disk backlogs; owns none of them."""

    def __init__(self, cluster: Cluster, holders: HolderIndex, backlog: LinkBacklog, spread: int,
                 ramp: JoinRamp | None = None, disks: DiskBacklog | None = None) -> None:
        self._cluster = cluster
        self._disks = disks
        self._holders = holders
        self._backlog = backlog
        self._spread = spread
        self._ramp = ramp

    def candidates(self, hashes: list[int], now: float) -> list[Candidate]:
        """The nodes a route for hashes scores at now (the module docstring says which)."""
        out = self._scored(hashes, now, frozenset())
        if self._ramp is None or len(out) < 2 or not self._ramp.active(now):
            return out
        held_back = self._held_back(out, now)
        if not held_back:
            return out
        kept = [c for c in self._scored(hashes, now, held_back) if c.node_id not in held_back]
        return kept or out

    def candidate(self, node_id: NodeId, hashes: list[int], now: float) -> Candidate | None:
        """node_id as a candidate for hashes at now (None when it is not a
        live node): what a route scores it at, for a node a policy's routing
        preference names (preference.py) outside the ones candidates() took."""
        live = self._cluster.live_among((node_id,), now)
        if not live:
            return None
        n, holders = live[0], self._holders
        held = holders.longest_prefix(node_id, hashes)
        c = Candidate(n.node_id, n.pending_requests, held, n.geometry.block_size, n.bytes_per_block,
                      n.queue_ms_now, self._backlog.wait_ms(node_id, now),
                      entering_ms=self._cluster.entering_ms(n, now) if n.entering else ())
        if holders.has_lower_tiers():
            c.host_blocks, c.disk_blocks = holders.host_only_count(node_id, hashes, held), holders.disk_only_count(
                node_id, hashes, held)
            if self._disks is not None and c.disk_blocks:
                self._disk_wait(c, hashes, now)
        return c

    def _held_back(self, scored: list[Candidate], now: float) -> frozenset[NodeId]:
        """The ramping candidates over their allowance that do not hold
        strictly the longest prefix among scored."""
        ramp, cluster = self._ramp, self._cluster
        assert ramp is not None
        out = []
        for c in scored:
            if ramp.over(c.node_id, now, cluster.routes_total, cluster.get(c.node_id).routes_total) and any(
                    o.cached_blocks >= c.cached_blocks for o in scored if o.node_id != c.node_id):
                out.append(c.node_id)
        return frozenset(out)

    def _scored(self, hashes: list[int], now: float, held_back: frozenset[NodeId]) -> list[Candidate]:
        cluster = self._cluster
        root_holders = self._holders.holder_set(hashes[0]) if hashes else ()
        if len(root_holders) > 2 * self._spread:
            lengths = self._holders.prefix_lengths(hashes, 2)
            deep: Collection[NodeId] = lengths.keys() | held_back if held_back else lengths
            for node_id in self._least_queued_shallow(root_holders, deep, now):
                lengths[node_id] = 1 if node_id in root_holders else 0
            nodes = cluster.live_among(lengths, now)
        else:
            lengths = self._holders.prefix_lengths(hashes)
            nodes = cluster.live_among(lengths, now)
            exclude: Collection[NodeId] = lengths.keys() | held_back if held_back else lengths
            nodes.extend(cluster.get(node_id) for node_id in cluster.least_loaded(self._spread, now, exclude))
        held = lengths.get
        wait_ms = self._backlog.wait_ms
        entering = cluster.entering_ms
        # n.queue_ms_now is cluster.queue_ms(n), kept by the cluster at every change of its inputs.
        if not self._holders.has_lower_tiers():  # no node holds a block below its device tier: all 0
            return [Candidate(n.node_id, n.pending_requests, held(n.node_id, 0), n.geometry.block_size,
                              n.bytes_per_block, n.queue_ms_now, wait_ms(n.node_id, now),
                              entering_ms=entering(n, now) if n.entering else ()) for n in nodes]
        host_only, disk_only = self._holders.host_only_count, self._holders.disk_only_count
        out = [Candidate(n.node_id, n.pending_requests, held(n.node_id, 0), n.geometry.block_size,
                         n.bytes_per_block, n.queue_ms_now, wait_ms(n.node_id, now),
                         host_only(n.node_id, hashes, held(n.node_id, 0)),
                         disk_only(n.node_id, hashes, held(n.node_id, 0)),
                         entering_ms=entering(n, now) if n.entering else ()) for n in nodes]
        if self._disks is not None:
            for c in out:
                if c.disk_blocks:
                    self._disk_wait(c, hashes, now)
        return out

    def _disk_wait(self, c: Candidate, hashes: list[int], now: float) -> None:
        """c's wait for its disk (disk_backlog.py): a stage in flight there
        that reads its prefix (joined), else the reads booked before it."""
        disks = self._disks
        assert disks is not None
        joined = disks.joined_ms(c.node_id, hashes[c.cached_blocks - 1], now)
        if joined is not None:
            c.disk_wait_ms, c.disk_joined = joined, True
        else:
            c.disk_wait_ms = disks.wait_ms(c.node_id, now)

    def _least_queued_shallow(self, root_holders: Collection[NodeId], deep: Collection[NodeId],
                              now: float) -> list[NodeId]:
        """The `spread` least-queued live nodes holding only the first block,
        and the `spread` least queued holding none (outside deep). From the
        load board when at least one node in 8 holds the first block (it
        finds `spread` of them within about 8 x spread steps), else from the
        holders themselves."""
        cluster, spread = self._cluster, self._spread
        if 8 * len(root_holders) >= cluster.num_nodes():
            popped = cluster.least_loaded(spread, now, deep, root_holders)
            bare = [n for n in popped if n not in root_holders][:spread]
            return [n for n in popped if n in root_holders] + bare
        shallow = [n for n in cluster.live_among(root_holders, now) if n.node_id not in deep]
        # sort()[:k] is what heapq.nsmallest returns (the key is unique),
        # without nsmallest's interpreted loop: a few dozen nodes per route.
        shallow.sort(key=lambda n: (cluster.queue_ms(n), n.node_id))
        picked = [n.node_id for n in shallow[:spread]]
        return picked + cluster.least_loaded(spread, now, set(deep) | set(root_holders))

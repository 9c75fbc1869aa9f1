"""What a routed request changes in the planner's picture, apart from the
decision itself: RouteObservation records it and RouteObserver applies it.

A Route decides (routing/router.py) and then observes its own decision; a
scheduler replica that did not answer the Route can observe the same record
(SchedulerCore.observe_routes) and end with the same planner-facing state
(pending load, link and disk bookings, pull and disk-load rates, reuse history, the family
catalog and its root in the block index, replica use, action outcomes) as if
it had routed the request itself. Applying an observation decides nothing
and reads no candidates: every figure it needs travels in the record, but
for how many of a pull's blocks its source reads off its disk, which the
holder index says (kept by every replica from the same kvstore events).

Applied at clock time `now` (s) to the chosen node, which must be known to
this core (an observation of a node it does not know is skipped: a replica
that has not seen the node's registration yet has no pending load to add
to). Times are seconds on the applying core's clock; `arrival_s` is capped
at `now` so a peer whose clock runs behind books nothing in its future.
Not thread-safe: SchedulerCore applies observations under its lock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.cluster import Cluster
from speckv.services.scheduler.families import FamilyCatalog
from speckv.services.scheduler.holder_index import HolderIndex
from speckv.services.scheduler.replication.lifecycle import OrderLifecycle
from speckv.services.scheduler.reuse_history import ReuseHistory
from speckv.services.scheduler.routing.disk_backlog import DiskBacklog
from speckv.services.scheduler.routing.link_backlog import LinkBacklog
from speckv.services.scheduler.routing.router import Candidate, RouteDecision, RouteQuery, longer_holder


@dataclass(slots=True)
class RouteObservation:
    """One routed request as the planner sees it; never changed once made
    (not frozen only because a frozen record costs a Route 2 us to build).

    block_hashes is the request's chain (the query's own list: never mutated
    after the route). uncached_tokens >= 1 are the tokens node_id must
    prefill (its pending load until its next queue report), prefill_ms their
    expected prefill time. fetch_from/fetch_blocks: the pull the route chose
    (None/0: none). pull_holder: the node whose link the route wanted, the
    pull's source or a node holding a longer prefix than node_id (it could
    have pulled from it, whether it did or not; link_backlog.py counts both).
    arrival_s: when the request arrived (<= the routing clock's now).
    disk_blocks: of cached_blocks, those node_id reads off its own disk
    (disk_backlog.py books that read; 0 when none, or when they come with a
    stage in flight there that the request joins). enters_in_ms: how long
    after its arrival the request joins node_id's engine queue, its promotion
    or pull first (0: at once); a request routed there later without one
    goes ahead of it (router.py, the prefill-ahead charge)."""

    family: Family
    block_hashes: Sequence[int]
    prompt_tokens: int
    node_id: NodeId
    cached_blocks: int
    fetch_blocks: int
    fetch_from: NodeId | None
    pull_holder: NodeId | None
    prefill_ms: float
    uncached_tokens: int
    arrival_s: float
    disk_blocks: int = 0
    enters_in_ms: float = 0.0

    @classmethod
    def of(cls, query: RouteQuery, decision: RouteDecision, candidates: Sequence[Candidate], uncached: int,
           arrival_s: float) -> RouteObservation:
        """The observation of routing query to decision among candidates."""
        holder = decision.fetch_from or longer_holder(candidates, decision)
        return cls(query.family, query.block_hashes, query.prompt_tokens, decision.node_id, decision.cached_blocks,
                   decision.fetch_blocks, decision.fetch_from, holder, decision.prefill_ms, uncached, arrival_s,
                   0 if decision.disk_joined else decision.disk_blocks,
                   max(decision.promote_ms, decision.fetch_ms))


class RouteObserver:
    """Applies observations to the core's planner state (it holds no state of its own)."""

    def __init__(self, cluster: Cluster, backlog: LinkBacklog, reuse: ReuseHistory, index: HolderIndex,
                 families: FamilyCatalog, lifecycle: OrderLifecycle, disks: DiskBacklog | None = None) -> None:
        self._cluster, self._backlog, self._reuse, self._disks = cluster, backlog, reuse, disks
        self._index, self._families, self._lifecycle = index, families, lifecycle

    def apply(self, o: RouteObservation, now: float) -> bool:
        """Applies o at now; False (nothing changed) when its node is unknown here."""
        node = self._cluster.find(o.node_id)
        if node is None:
            return False
        arrival_s = min(o.arrival_s, now)
        node_id = node.node_id
        # It joins the engine queue enters_in_ms after it arrived, as its pull is booked on the links from then:
        # the warm start's history, routed at once long after it arrived, leaves nobody still fetching.
        enters_in_ms = o.enters_in_ms - (now - arrival_s) * 1000.0
        self._cluster.add_pending(node_id, o.uncached_tokens, o.prefill_ms, now, max(0.0, enters_in_ms))
        if o.fetch_from is not None:
            self._backlog.add(o.fetch_from, node_id, o.fetch_blocks * node.bytes_per_block, arrival_s)
        if o.pull_holder is not None:
            self._backlog.note_pull(o.pull_holder, node_id, arrival_s)
        if o.disk_blocks and self._disks is not None:
            self._disks.add(node_id, o.disk_blocks * node.bytes_per_block, arrival_s)
            self._disks.note_load(node_id, arrival_s)
        if o.fetch_from is not None and o.fetch_blocks and self._disks is not None:
            self._book_pull_read(o, node.bytes_per_block, arrival_s)
        hashes = o.block_hashes
        if hashes:
            self._reuse.wanted(hashes, now, o.cached_blocks + o.fetch_blocks, node_id)
            self._index.note_family(o.family, hashes[0])
            self._families.observe(o.family, hashes, o.prompt_tokens, node_id, now, arrival_s)
            if o.cached_blocks or o.fetch_blocks:
                self._lifecycle.ledger.mark_used(o.family, node_id)
            self._lifecycle.outcomes.routed(o.family, node_id, o.cached_blocks > 0, now)
        return True

    def _book_pull_read(self, o: RouteObservation, bytes_per_block: int, at_s: float) -> None:
        """A pull's source stages the pulled blocks only its disk holds
        before serving them: that read holds its disk (disk_backlog.py) as
        the node's own disk loads do. Counted from this core's holder index
        (every replica keeps it from the same events), over the pulled range."""
        disks = self._disks
        assert disks is not None and o.fetch_from is not None
        pulled = o.block_hashes[o.cached_blocks:o.cached_blocks + o.fetch_blocks]
        on_disk = self._index.disk_only_count(o.fetch_from, pulled, len(pulled))
        if on_disk:
            disks.add(o.fetch_from, on_disk * bytes_per_block, at_s)
            disks.note_load(o.fetch_from, at_s)

"""Content-addressed index of one node: block hash -> page, with pin counts,
speculative-replica leases and the eviction order.

Eviction order (the policy, in full):
  1. speculative replicas whose lease has lapsed (deadline <= now), earliest
     deadline first: a wrong guess is the first thing to give back;
  2. then least-recently-used among all unpinned blocks (replicas whose lease
     is still running included: the lease protects a replica from rule 1's
     priority, not from ordinary LRU).
Pinned blocks (pin count > 0) are never evicted. Retained blocks (the
retain action, services/common/retention.py: the caller passes the node's
Retention to its last tier only) are passed over by both rules, a retained
block at the LRU head going to the recent end, unless every candidate is
retained.

Within one use of a chain (a prompt's blocks, head first) the head ends most
recently used: callers touch, unpin and publish chains tail first
(touch_chain). A chain is useless without its head, so LRU must take its
tail first; head-first eviction would break the prefix while its tail stays
resident as dead weight. vLLM frees a request's blocks in reverse for the
same reason.

A committed replica carries a lease deadline until it is first *used*: a
lookup hit, a read or a re-put touches it, which clears the lease and makes it
an ordinary block (the speculation paid off; it now lives by LRU like any
other). Reads done by the replication source do not count as uses.

Costs: insert, touch, pin, unpin and each eviction are O(1) amortised (an
OrderedDict LRU of unpinned hashes) plus O(log n) for the lease heap, which is
lazy: stale heap entries are skipped when popped and the heap is rebuilt when
it holds more than twice the live leases.

Not thread-safe: the store serializes every call.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.ids import BlockHash
from speckv.services.common.retention import Retention
from speckv.services.kvstore.pool import PageId

MAX_HASH = (1 << 64) - 1


@dataclass(slots=True)
class BlockEntry:
    """One resident block. lease_deadline is set only for a speculative
    replica not yet used (node clock, seconds)."""

    block_hash: BlockHash
    page: PageId
    family: str = ""
    parent: BlockHash | None = None
    pins: int = 0
    lease_deadline: float | None = None


class BlockIndex:
    def __init__(self) -> None:
        self._entries: dict[BlockHash, BlockEntry] = {}
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()  # unpinned only, LRU first
        self._leases: list[tuple[float, int, BlockHash]] = []  # (deadline, tiebreak, hash)
        self._tiebreak = itertools.count()
        self.pinned_count = 0  # blocks with pins > 0
        self.replica_count = 0  # blocks with a lease

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._entries

    def get(self, block_hash: int) -> BlockEntry | None:
        return self._entries.get(block_hash)  # type: ignore[call-overload]

    def hashes(self) -> list[BlockHash]:
        return list(self._entries)

    @property
    def evictable_count(self) -> int:
        return len(self._lru)

    def insert(self, entry: BlockEntry) -> None:
        """Adds a new unpinned block as most recently used."""
        if entry.block_hash in self._entries:
            raise ValueError(f"block {entry.block_hash:#x} already indexed")  # store checks first
        entry.pins = 0
        self._entries[entry.block_hash] = entry
        self._lru[entry.block_hash] = None
        if entry.lease_deadline is not None:
            self.replica_count += 1
            self._push_lease(entry)

    def touch(self, block_hash: BlockHash) -> None:
        """Marks a use: most recently used, and a replica becomes ordinary."""
        entry = self._entries[block_hash]
        if entry.lease_deadline is not None:
            entry.lease_deadline = None  # its heap entry is now stale
            self.replica_count -= 1
        if entry.pins == 0:
            self._lru.move_to_end(block_hash)

    def touch_chain(self, hashes: Sequence[BlockHash]) -> None:
        """Marks a use of a chain (given head first): touched tail first, so
        the head ends most recent and is evicted last."""
        for block_hash in reversed(hashes):
            self.touch(block_hash)

    def pin(self, block_hash: BlockHash) -> None:
        entry = self._entries[block_hash]
        entry.pins += 1
        if entry.pins == 1:
            del self._lru[block_hash]
            self.pinned_count += 1

    def unpin(self, block_hash: BlockHash) -> None:
        """Caller checks pins > 0."""
        entry = self._entries[block_hash]
        entry.pins -= 1
        if entry.pins == 0:
            self._lru[block_hash] = None
            self.pinned_count -= 1
            if entry.lease_deadline is not None:
                self._push_lease(entry)  # it may have been dropped while pinned

    def longest_prefix(self, hashes: Sequence[int]) -> int:
        """Number of leading hashes that are all resident."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._entries:
                break
            count += 1
        return count

    def pop_victim(self, now: float, protect: frozenset[BlockHash] | set[BlockHash] = frozenset(),
                   retention: Retention | None = None) -> BlockEntry | None:
        """Removes and returns the next block to evict, or None if every
        resident block is pinned or protected. Protected blocks are passed
        over where they stand: unlike a pin, protecting moves nothing in the
        eviction order. Retained blocks are passed over as the module
        docstring says."""
        passed: list[tuple[float, int, BlockHash]] = []
        try:
            while self._leases and self._leases[0][0] <= now:
                item = heapq.heappop(self._leases)
                deadline, _, block_hash = item
                entry = self._entries.get(block_hash)
                if entry is not None and entry.lease_deadline == deadline and entry.pins == 0:
                    if block_hash in protect or (retention and retention.holds(block_hash, now)):
                        passed.append(item)
                        continue
                    return self.remove(block_hash)
        finally:
            for item in passed:
                heapq.heappush(self._leases, item)
        if retention:
            self._pass_over_retained(retention, now, protect)
            for block_hash in self._lru:
                if block_hash not in protect and not retention.holds(block_hash, now):
                    return self.remove(block_hash)
        for block_hash in self._lru:
            if block_hash not in protect:
                return self.remove(block_hash)
        return None

    def _pass_over_retained(self, retention: Retention, now: float,
                            protect: frozenset[BlockHash] | set[BlockHash]) -> None:
        """Moves the retained blocks before the first unretained one (protect
        aside, where they stand) to the recent end, in order: a second chance."""
        moved = []
        for block_hash in self._lru:
            if block_hash in protect:
                continue
            if not retention.holds(block_hash, now):
                break
            moved.append(block_hash)
        for block_hash in moved:
            self._lru.move_to_end(block_hash)

    def remove(self, block_hash: BlockHash) -> BlockEntry:
        """Drops an unpinned block from the index (its page is the caller's)."""
        entry = self._entries[block_hash]
        if entry.pins:
            raise ValueError(f"block {block_hash:#x} is pinned")
        del self._entries[block_hash]
        del self._lru[block_hash]
        if entry.lease_deadline is not None:
            self.replica_count -= 1
        return entry

    def _push_lease(self, entry: BlockEntry) -> None:
        assert entry.lease_deadline is not None
        heapq.heappush(self._leases, (entry.lease_deadline, next(self._tiebreak), entry.block_hash))
        if len(self._leases) > 2 * self.replica_count + 64:
            self._rebuild_leases()

    def _rebuild_leases(self) -> None:
        self._leases = [
            (e.lease_deadline, next(self._tiebreak), e.block_hash)
            for e in self._entries.values() if e.lease_deadline is not None]
        heapq.heapify(self._leases)


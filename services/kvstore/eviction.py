"""Eviction order of one tier's block index, as a strategy object.

The algorithm (LapsedThenLRU, the one policy):
  1. speculative replicas whose lease has lapsed (deadline <= now), earliest
     deadline first (ties: the lease set first): a wrong guess is the first
     thing to give back;
  2. then the least recently used unpinned block (replicas whose lease is
     still running included: the lease protects a replica from rule 1's
     priority, not from ordinary LRU).
Pinned blocks are never candidates: the index hands a block over on its
first pin and back, as most recent, on its last unpin. Blocks the caller
protects are passed over where they stand (nothing moves). Retained blocks
(services/common/retention.py) are passed over by both rules; a retained
block ahead of the first unretained one at the LRU head goes to the recent
end (a second chance), and when every candidate is retained the LRU head
goes after all.

Eviction is the one interface the index (index.py) asks of it, as SGLang's
radix cache and LMCache take theirs: the index keeps the entries, pins and
leases; the strategy keeps only the order among the unpinned blocks and
chooses the next victim, which the index then removes.

Costs: every notification is O(1) amortised (an OrderedDict, least recent
first) plus O(log n) for the lease heap, which is lazy: entries whose block
left, was used or is pinned are skipped when popped, and the heap is rebuilt
from the index's entries when it holds more than twice the live leases.

Not thread-safe: the store serializes every call.
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Iterator, Mapping

from speckv.services.common.ids import BlockHash
from speckv.services.common.retention import Retention

if TYPE_CHECKING:
    from speckv.services.kvstore.index import BlockEntry

Protect = frozenset[BlockHash] | set[BlockHash]


class Eviction:
    """The interface: what an index tells its eviction order, and asks of
    it. Candidates are the unpinned blocks; the index calls `added` for a
    new block, `used` for a use, `held` on a first pin, `released` on a last
    unpin and `dropped` when a candidate leaves, and removes what `victim`
    names."""

    def added(self, entry: BlockEntry, replicas: int) -> None:
        """A new unpinned block, now the most recent; replicas: the index's
        live leases, this one's counted."""
        raise NotImplementedError

    def used(self, block_hash: BlockHash) -> None:
        """A use of an unpinned block: now the most recent."""
        raise NotImplementedError

    def held(self, block_hash: BlockHash) -> None:
        """A first pin: no longer a candidate."""
        raise NotImplementedError

    def released(self, entry: BlockEntry, replicas: int) -> None:
        """A last unpin: a candidate again, the most recent."""
        raise NotImplementedError

    def dropped(self, block_hash: BlockHash) -> None:
        """An unpinned block left the index."""
        raise NotImplementedError

    def victim(self, now: float, protect: Protect, retention: Retention | None) -> BlockHash | None:
        """The next block to evict (still indexed: the index removes it),
        or None if every candidate is protected."""
        raise NotImplementedError

    def __len__(self) -> int:
        """Candidates (the unpinned blocks)."""
        raise NotImplementedError

    def order(self) -> Iterator[BlockHash]:
        """The candidates, least recently used first."""
        raise NotImplementedError


class LapsedThenLRU(Eviction):
    """Lapsed replicas first, then LRU (the module docstring). entries is the
    index's own map, read to tell live leases from stale heap entries."""

    def __init__(self, entries: Mapping[BlockHash, BlockEntry]) -> None:
        self._entries = entries
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()  # unpinned only, LRU first
        self._leases: list[tuple[float, int, BlockHash]] = []  # (deadline, tiebreak, hash)
        self._tiebreak = itertools.count()

    def __len__(self) -> int:
        return len(self._lru)

    def order(self) -> Iterator[BlockHash]:
        return iter(self._lru)

    def added(self, entry: BlockEntry, replicas: int) -> None:
        self._lru[entry.block_hash] = None
        if entry.lease_deadline is not None:
            self._push_lease(entry, replicas)

    def used(self, block_hash: BlockHash) -> None:
        self._lru.move_to_end(block_hash)

    def held(self, block_hash: BlockHash) -> None:
        del self._lru[block_hash]

    def released(self, entry: BlockEntry, replicas: int) -> None:
        self._lru[entry.block_hash] = None
        if entry.lease_deadline is not None:
            self._push_lease(entry, replicas)  # it may have been dropped while pinned

    def dropped(self, block_hash: BlockHash) -> None:
        del self._lru[block_hash]

    def victim(self, now: float, protect: Protect, retention: Retention | None) -> BlockHash | None:
        lapsed = self._lapsed(now, protect, retention)
        if lapsed is not None:
            return lapsed
        if retention:
            self._pass_over_retained(retention, now, protect)
            for block_hash in self._lru:
                if block_hash not in protect and not retention.holds(block_hash, now):
                    return block_hash
        for block_hash in self._lru:
            if block_hash not in protect:
                return block_hash
        return None

    def _lapsed(self, now: float, protect: Protect, retention: Retention | None) -> BlockHash | None:
        """Rule 1: the earliest lapsed lease of a candidate neither protected
        nor retained. Stale heap entries are dropped; passed ones go back."""
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
                    return block_hash
        finally:
            for item in passed:
                heapq.heappush(self._leases, item)
        return None

    def _pass_over_retained(self, retention: Retention, now: float, protect: Protect) -> None:
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

    def _push_lease(self, entry: BlockEntry, replicas: int) -> None:
        assert entry.lease_deadline is not None
        heapq.heappush(self._leases, (entry.lease_deadline, next(self._tiebreak), entry.block_hash))
        if len(self._leases) > 2 * replicas + 64:
            self._rebuild_leases()

    def _rebuild_leases(self) -> None:
        """The live leases only, in the order their blocks were indexed."""
        self._leases = [
            (e.lease_deadline, next(self._tiebreak), e.block_hash)
            for e in self._entries.values() if e.lease_deadline is not None]
        heapq.heapify(self._leases)

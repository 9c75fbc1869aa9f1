"""Content-addressed index of one node's tier: block hash -> page, with pin
counts and speculative-replica leases; the eviction order is a strategy
object (eviction.py says the one policy: lapsed replicas first, then LRU;
pins and protected blocks never taken, retained ones passed over).

Pinned blocks (pin count > 0) are never evicted. Retained blocks (the
retain action, services/common/retention.py: the caller passes the node's
Retention to its last tier only) are passed over as eviction.py says.

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

Costs: insert, touch, pin, unpin and each eviction are O(1) amortised plus
the strategy's own (eviction.py).

Not thread-safe: the store serializes every call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from speckv.services.common.ids import BlockHash
from speckv.services.common.retention import Retention
from speckv.services.kvstore.eviction import Eviction, LapsedThenLRU
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
    """eviction: makes the index's eviction order from its entries map
    (default: eviction.LapsedThenLRU, the one policy)."""

    def __init__(self, eviction: Callable[[Mapping[BlockHash, BlockEntry]], Eviction] | None = None) -> None:
        self._entries: dict[BlockHash, BlockEntry] = {}
        self._eviction: Eviction = (eviction or LapsedThenLRU)(self._entries)
        self.pinned_count = 0  # blocks with pins > 0
        self.replica_count = 0  # blocks with a lease

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._entries

    def __iter__(self) -> Iterator[BlockHash]:
        """The resident hashes, in the order they were indexed."""
        return iter(self._entries)

    def get(self, block_hash: int) -> BlockEntry | None:
        return self._entries.get(block_hash)  # type: ignore[call-overload]

    def hashes(self) -> list[BlockHash]:
        return list(self._entries)

    def eviction_order(self) -> list[BlockHash]:
        """The unpinned blocks, least recently used first."""
        return list(self._eviction.order())

    @property
    def evictable_count(self) -> int:
        return len(self._eviction)

    def insert(self, entry: BlockEntry) -> None:
        """Adds a new unpinned block as most recently used."""
        if entry.block_hash in self._entries:
            raise ValueError(f"block {entry.block_hash:#x} already indexed")  # store checks first
        entry.pins = 0
        self._entries[entry.block_hash] = entry
        if entry.lease_deadline is not None:
            self.replica_count += 1
        self._eviction.added(entry, self.replica_count)

    def touch(self, block_hash: BlockHash) -> None:
        """Marks a use: most recently used, and a replica becomes ordinary."""
        entry = self._entries[block_hash]
        if entry.lease_deadline is not None:
            entry.lease_deadline = None  # its heap entry is now stale
            self.replica_count -= 1
        if entry.pins == 0:
            self._eviction.used(block_hash)

    def touch_chain(self, hashes: Sequence[BlockHash]) -> None:
        """Marks a use of a chain (given head first): touched tail first, so
        the head ends most recent and is evicted last."""
        for block_hash in reversed(hashes):
            self.touch(block_hash)

    def pin(self, block_hash: BlockHash) -> None:
        entry = self._entries[block_hash]
        entry.pins += 1
        if entry.pins == 1:
            self._eviction.held(block_hash)
            self.pinned_count += 1

    def unpin(self, block_hash: BlockHash) -> None:
        """Caller checks pins > 0."""
        entry = self._entries[block_hash]
        entry.pins -= 1
        if entry.pins == 0:
            self.pinned_count -= 1
            self._eviction.released(entry, self.replica_count)

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
        """Removes and returns the next block to evict (the strategy's
        choice), or None if every resident block is pinned or protected.
        Protected blocks are passed over where they stand: unlike a pin,
        protecting moves nothing in the eviction order."""
        block_hash = self._eviction.victim(now, protect, retention)
        return None if block_hash is None else self.remove(block_hash)

    def remove(self, block_hash: BlockHash) -> BlockEntry:
        """Drops an unpinned block from the index (its page is the caller's)."""
        entry = self._entries[block_hash]
        if entry.pins:
            raise ValueError(f"block {block_hash:#x} is pinned")
        del self._entries[block_hash]
        self._eviction.dropped(block_hash)
        if entry.lease_deadline is not None:
            self.replica_count -= 1
        return entry

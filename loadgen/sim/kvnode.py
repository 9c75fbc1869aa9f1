"""One node's KV store in simulation: which blocks it holds, without bytes.

It reuses the live kvstore's content-addressed index
(speckv.services.kvstore.index.BlockIndex), so residency and eviction follow
the same policy: lapsed speculative replicas first, then least recently
used. `pages` is the pool's capacity in blocks; a put that does not fit
evicts exactly as many victims as it needs. Lookups and re-puts touch
blocks (a replica's first use clears its lease), as the live store does.

Simplifications, said here once: nothing is pinned (a replication source's
blocks could be evicted mid-copy; the copy still lands), and there are no
reservations (a replica takes its pages when it commits, not when it starts).
Not thread-safe; times are virtual seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from speckv.services.kvstore.index import BlockEntry, BlockIndex


@dataclass(slots=True)
class PutOutcome:
    stored: list[int] = field(default_factory=list)  # newly resident, in order
    evicted: list[int] = field(default_factory=list)


class SimKVNode:
    def __init__(self, node_id: str, pages: int) -> None:
        if pages <= 0:
            raise ValueError(f"pages={pages}: must be > 0")
        self.node_id = node_id
        self.pages = pages
        self._index = BlockIndex()
        self._free: list[int] = list(range(pages - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._index

    @property
    def free_pages(self) -> int:
        """What a replica could get: free plus evictable (nothing is pinned here)."""
        return self.pages

    def lookup(self, hashes: Sequence[int]) -> int:
        """Blocks of the longest resident prefix; touches them (a use)."""
        n = self._index.longest_prefix(hashes)
        self._index.touch_chain(hashes[:n])  # type: ignore[arg-type]  # BlockHash is a NewType of int
        return n

    def holds_all(self, hashes: Sequence[int]) -> bool:
        return self._index.longest_prefix(hashes) == len(hashes)

    def put(self, hashes: Sequence[int], now: float, family: str = "", lease_deadline: float | None = None,
            first_parent: int | None = None) -> PutOutcome:
        """Stores a chain (each block's parent is the one before it); new
        blocks evict as needed, and the whole chain counts as a use with its
        head most recent (kvstore/index.py). lease_deadline marks new blocks
        as speculative replicas: then, as the live store publishes a replica,
        they go in tail first and resident ones are left as they are."""
        out = PutOutcome()
        stored, evicted = out.stored, out.evicted
        index, free = self._index, self._free
        pairs = list(zip(hashes, [first_parent, *hashes[:-1]]))
        if lease_deadline is not None:
            pairs.reverse()
        else:  # resident blocks of the chain are a use now: no insert below may evict them (the live store protects them)
            index.touch_chain([h for h in hashes if h in index])  # type: ignore[misc]
        # Hashes go in as plain ints (BlockHash / PageId are NewTypes of int):
        # this loop runs for every block of every prompt in the simulation.
        for h, parent in pairs:
            if h in index:
                continue
            if free:
                page = free.pop()
            else:
                victim = index.pop_victim(now)
                if victim is None:  # cannot happen: nothing is pinned
                    break
                page = victim.page
                evicted.append(int(victim.block_hash))
            index.insert(BlockEntry(h, page, family, parent,  # type: ignore[arg-type]
                                    lease_deadline=lease_deadline))
            stored.append(h)
        if lease_deadline is not None:
            stored.reverse()
        else:  # a chain longer than the pool evicts its own head: touch what is left
            index.touch_chain([h for h in hashes if h in index])  # type: ignore[misc]
        return out

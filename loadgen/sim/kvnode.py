"""One node's KV store in simulation: which blocks it holds, without bytes.

Residency and eviction follow the live kvstore's policy
(speckv.services.kvstore.index.BlockIndex), in full:
  1. speculative replicas whose lease has lapsed (deadline <= now), earliest
     deadline first (ties: the earlier stored);
  2. then the least recently used block.
A chain's use touches it tail first, so its head is the most recent and is
evicted last; a replica's first use (a lookup hit or a re-put) clears its
lease. `pages` is the pool's capacity in blocks: a put that does not fit
evicts exactly as many victims as it needs.

Why not the live index itself: it keeps a BlockEntry (page, family, parent,
pins) per block, and the simulator stores and evicts every block of every
prompt on hundreds of nodes; pages, pins and parents mean nothing here. So
this keeps only the order (an OrderedDict of hashes, least recent first)
and the unused replicas' deadlines (a dict plus a lazy heap, rebuilt when
stale entries outnumber the live leases, as the live index does).
tests/unit/loadgen/sim/test_kvnode.py replays random puts and lookups on both
and checks the same blocks are stored and evicted, in the same order.

Simplifications, said here once: nothing is pinned (a replication source's
blocks could be evicted mid-copy; the copy still lands), and there are no
reservations (a replica takes its pages when it commits, not when it starts).
Not thread-safe; times are virtual seconds.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence


@dataclass(slots=True)
class PutOutcome:
    stored: list[int]  # newly resident, in order
    evicted: list[int]


class SimKVNode:
    def __init__(self, node_id: str, pages: int) -> None:
        if pages <= 0:
            raise ValueError(f"pages={pages}: must be > 0")
        self.node_id = node_id
        self.pages = pages
        self._lru: OrderedDict[int, None] = OrderedDict()  # resident blocks, least recently used first
        self._lease: dict[int, float] = {}  # unused replica -> lease deadline
        self._leases: list[tuple[float, int, int]] = []  # (deadline, tiebreak, hash); stale entries skipped
        self._tiebreak = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    @property
    def free_pages(self) -> int:
        """What a replica could get: free plus evictable (nothing is pinned here)."""
        return self.pages

    def lookup(self, hashes: Sequence[int]) -> int:
        """Blocks of the longest resident prefix; touches them (a use)."""
        n = self._longest_prefix(hashes)
        self._touch_chain(hashes[:n])
        return n

    def holds_all(self, hashes: Sequence[int]) -> bool:
        return self._longest_prefix(hashes) == len(hashes)

    def put(self, hashes: Sequence[int], now: float, lease_deadline: float | None = None) -> PutOutcome:
        """Stores a chain (head first); new blocks evict as needed, and the
        whole chain counts as a use with its head most recent. lease_deadline
        marks new blocks as speculative replicas: then, as the live store
        publishes a replica, they go in tail first and resident ones are
        left as they are."""
        out = PutOutcome([], [])
        stored, evicted = out.stored, out.evicted
        lru = self._lru
        order = list(hashes)
        if lease_deadline is not None:
            order.reverse()
        else:  # resident blocks of the chain are a use now: no insert below may evict them (the live store protects them)
            self._touch_chain([h for h in hashes if h in lru])
        # This loop runs for every block of every prompt in the simulation.
        for h in order:
            if h in lru:
                continue
            if len(lru) >= self.pages:
                evicted.append(self._pop_victim(now))
            lru[h] = None
            if lease_deadline is not None:
                self._lease[h] = lease_deadline
                self._push_lease(lease_deadline, h)
            stored.append(h)
        if lease_deadline is not None:
            stored.reverse()
        else:  # a chain longer than the pool evicts its own head: touch what is left
            self._touch_chain([h for h in hashes if h in lru])
        return out

    def _longest_prefix(self, hashes: Sequence[int]) -> int:
        lru, count = self._lru, 0
        for h in hashes:
            if h not in lru:
                break
            count += 1
        return count

    def _touch_chain(self, hashes: Sequence[int]) -> None:
        """A use of a chain (given head first, all resident): tail first, so
        the head ends most recent; a use makes a replica an ordinary block."""
        lru, lease = self._lru, self._lease
        for h in reversed(hashes):
            if lease:
                lease.pop(h, None)  # its heap entry is now stale
            lru.move_to_end(h)

    def _pop_victim(self, now: float) -> int:
        """Removes and returns the next block to evict (the pool is full, so one exists)."""
        leases, lease = self._leases, self._lease
        while leases and leases[0][0] <= now:
            deadline, _, h = heapq.heappop(leases)
            if lease.get(h) == deadline:
                del lease[h]
                del self._lru[h]
                return h
        h, _ = self._lru.popitem(last=False)
        lease.pop(h, None)
        return h

    def _push_lease(self, deadline: float, h: int) -> None:
        self._tiebreak += 1
        heapq.heappush(self._leases, (deadline, self._tiebreak, h))
        if len(self._leases) > 2 * len(self._lease) + 64:
            self._leases = []
            for block, d in self._lease.items():  # in the order their leases were set, as the live index rebuilds
                self._tiebreak += 1
                self._leases.append((d, self._tiebreak, block))
            heapq.heapify(self._leases)

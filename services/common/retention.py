"""Retention: blocks a node keeps from leaving it until a deadline (the
retain action of the planner; Continuum's TTL pinning of a tool call's KV,
here for any forecast return).

Rules, shared by the live kvstore (services/kvstore) and the simulator
(loadgen/sim/kvnode.py), so both evict the same blocks; the planner keeps a
shadow of each node's retention with the same rules
(services/scheduler/replication/retention_plan.py), so it orders only what
the node will keep:
- Retention protects a block in its node's last tier (the host tier when
  the node has one, else the device tier): a retained block may still be
  demoted from the device tier to the host tier, which loses nothing; it is
  not dropped from the node before its deadline.
- Eviction in the last tier passes over a retained block met at the LRU
  head by moving it to the most recent end (a second chance), so passing
  over costs O(1) amortised and a retention buys at least its deadline.
- At most `max_blocks` blocks are retained at once (a configured share of
  the last tier's pages): a retain that would exceed it retains the head of
  its chain only, so a tier can always make room. If every evictable block
  is retained anyway (pins, reservations), eviction takes the LRU head:
  retention is a preference, never a reason to refuse a write.
- Deadlines only grow: retaining a retained block keeps the later one.

Times are the caller's clock, in seconds. Pure, not thread-safe.
"""
from __future__ import annotations

import bisect
import heapq
from collections import deque
from typing import Sequence


class Retention:
    """block hash -> retained-until deadline (s), at most max_blocks of them."""

    def __init__(self, max_blocks: int, lapse_log_s: float = 0.0) -> None:
        """lapse_log_s: how long (s) to remember the deadlines of retentions
        that lapsed (lapsed_since); 0: not at all."""
        if max_blocks < 0:
            raise ValueError(f"max_blocks={max_blocks}: must be >= 0")
        if not lapse_log_s >= 0.0:
            raise ValueError(f"lapse_log_s={lapse_log_s}: must be >= 0")
        self.max_blocks = max_blocks
        self._until: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []  # (deadline, hash); stale entries skipped
        self._lapse_log_s = lapse_log_s
        self._lapsed: deque[float] = deque()  # deadlines purged within lapse_log_s, ascending

    def __len__(self) -> int:
        """Blocks retained, expired ones included until the next purge."""
        return len(self._until)

    def __bool__(self) -> bool:
        return bool(self._until)

    def holds(self, block_hash: int, now: float) -> bool:
        """Whether block_hash is retained at now."""
        until = self._until.get(block_hash)
        return until is not None and until > now

    def retain(self, hashes: Sequence[int], until: float, now: float) -> int:
        """Retains hashes (a chain, head first) until `until`, as far as the
        cap allows: returns how many of them are retained until then."""
        self.purge(now)
        if until <= now:
            return 0
        held = self._until
        count = 0
        for h in hashes:
            old = held.get(h)
            if old is None:
                if len(held) >= self.max_blocks:
                    break
            elif old >= until:
                count += 1
                continue
            held[h] = until
            heapq.heappush(self._heap, (until, h))
            count += 1
        if len(self._heap) > 2 * len(held) + 64:
            self._heap = [(d, h) for h, d in held.items()]
            heapq.heapify(self._heap)
        return count

    def fits(self, hashes: Sequence[int], now: float, store_count: int = 0, counted_at: float | None = None) -> int:
        """How many of hashes (a chain, head first) `retain` would keep now:
        blocks already retained cost nothing, each new one a place under the
        cap, up to the first new block past it. Retains nothing.

        store_count: the blocks the node this shadows said it retained in
        all, at counted_at (s; None: now), 0: unknown. Less the retentions
        of this one that lapsed since (the node still counted them), where
        that is more than this Retention holds, the others (retains it never
        saw) take places too, and are taken to be none of hashes: the answer
        errs toward fewer."""
        self.purge(now)
        others = store_count - (0 if counted_at is None else self.lapsed_since(counted_at))
        held, count = self._until, 0
        free = self.max_blocks - max(len(held), others)
        added: set[int] = set()  # a hash the chain repeats takes one place, as in retain
        for h in hashes:
            if h not in held and h not in added:
                if free <= 0:
                    break
                free -= 1
                added.add(h)
            count += 1
        return count

    def release(self, hashes: Sequence[int]) -> None:
        """Forgets the retention of hashes (blocks that left the node)."""
        for h in hashes:
            self._until.pop(h, None)

    def purge(self, now: float) -> None:
        """Forgets every retention whose deadline has passed."""
        heap, held, lapsed = self._heap, self._until, self._lapsed
        while heap and heap[0][0] <= now:
            deadline, h = heapq.heappop(heap)
            if held.get(h) == deadline:
                del held[h]
                if self._lapse_log_s > 0.0:
                    if lapsed and deadline < lapsed[-1]:  # a purge at an earlier now than the last one
                        bisect.insort(lapsed, deadline)
                    else:
                        lapsed.append(deadline)
        while lapsed and lapsed[0] <= now - self._lapse_log_s:
            lapsed.popleft()

    def lapsed_since(self, since: float) -> int:
        """Retentions that lapsed after since (s) and by the last purge, as
        far back as lapse_log_s before that purge (an older since counts
        only those)."""
        count = 0
        for deadline in reversed(self._lapsed):
            if deadline <= since:
                break
            count += 1
        return count

"""Room-making and write-back between one node's tiers (KVStoreCore,
store.py, composes this; the lock is held throughout).

A request that needs n pages of a tier evicts only as many blocks as the
free pages fall short by, by the tier's eviction order (index.py,
eviction.py), never pinned blocks nor the ones the request names, and
raises ResourceExhausted, changing nothing, when that is impossible. Device
victims are demoted (write-back): each one evicted by LRU goes to the host
tier as its most recent block, in eviction order; a lapsed replica is
dropped; a block the host tier holds already is only touched there; what
the host tier cannot make room for is dropped. Host victims go down to the
disk tier where the node has one (store_disk.py: queued for its writer),
else they are dropped. The last memory tier's evictions
pass over retained blocks, and what a call takes off the node ends its
retention.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from speckv.services.common.errors import ResourceExhausted
from speckv.services.common.ids import BlockHash
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.index import BlockEntry
from speckv.services.kvstore.pool import PageId
from speckv.services.kvstore.tier import StoreTier


if TYPE_CHECKING:
    from speckv.services.kvstore.store import KVStoreCore

class WriteBack:
    """KVStoreCore's allocation, eviction and demotion (a base of KVStoreCore only)."""

    def _allocate(self: KVStoreCore, count: int, protect: Sequence[BlockHash], what: str) -> tuple[list[PageId], int]:
        """count device pages, evicting as few blocks as needed but none of
        protect; evicted blocks are demoted to the host tier (_demote).
        Raises ResourceExhausted, changing nothing, when that is impossible."""
        victims = self._evict(self._device, count, protect, what)
        if victims:
            self._demote(victims)
            self._pool.free([v.page for v in victims])
            self._evicted_total += len(victims)
            self._events.append(EventType.REMOVED, tuple(v.block_hash for v in victims), medium=Tier.DEVICE.medium)
        return self._pool.alloc(count), len(victims)

    def _allocate_host(self: KVStoreCore, count: int, protect: Sequence[BlockHash], what: str) -> tuple[list[PageId], int]:
        """count host pages, evicting as few host blocks as needed but none of
        protect; the victims go down to the disk tier if the node has one
        (store_disk.py), else they are dropped."""
        host = self._host
        assert host is not None
        victims = self._evict(host, count, protect, what)
        if victims:
            kept = self._offer_to_disk(victims)  # store_disk.py: demoted to the disk tier, if there is one
            host.pool.free([v.page for v in victims])
            self._dropped_total += sum(1 for v in victims if v.block_hash not in self._index and v.block_hash not in kept)
            self._events.append(EventType.REMOVED, tuple(v.block_hash for v in victims), medium=Tier.HOST.medium)
        return host.pool.alloc(count), len(victims)

    def _evict(self: KVStoreCore, tier: StoreTier, count: int, protect: Sequence[BlockHash], what: str) -> list[BlockEntry]:
        """Removes from tier's index the victims count new pages need (its
        pool keeps their pages until the caller frees them)."""
        pool, index = tier.pool, tier.index
        shortfall = count - pool.free_count
        if shortfall <= 0:
            return []
        guarded = {h for h in protect if h in index}
        shielded = sum(1 for h in guarded if index.get(h).pins == 0)  # type: ignore[union-attr]
        evictable = index.evictable_count - shielded
        if evictable < shortfall:
            raise ResourceExhausted(
                f"{what}: needs {count} {tier.tier.name.lower()} pages but only {pool.free_count} are free and "
                f"{evictable} evictable ({index.pinned_count} pinned, {tier.book.reserved_pages} reserved, "
                f"{pool.num_pages} in all)")
        now = self.clock.now()
        retention = self._retention if tier is self._last else None
        victims = [index.pop_victim(now, guarded, retention) for _ in range(shortfall)]
        if self._retention:
            self._evicted_now.extend(v.block_hash for v in victims)  # type: ignore[union-attr]
        return victims  # type: ignore[return-value]

    def _settle_retention(self: KVStoreCore) -> None:
        """Ends the retention of what this call's evictions took off the node
        (not what it evicted and stored again), as the simulator does."""
        if self._evicted_now:
            self._retention.release([h for h in self._evicted_now if not self._holds(h)])
            self._evicted_now.clear()

    def _demote(self: KVStoreCore, victims: list[BlockEntry]) -> None:
        """Write-back of device victims (their pages still hold their bytes):
        each one evicted by LRU goes to the host tier as its most recent
        block, in eviction order, so a chain's head ends most recent there
        too; a lapsed replica is dropped; a block the host tier already holds
        is only touched there. What the host tier cannot make room for is
        dropped."""
        host, now = self._host, self.clock.now()
        if host is None:
            self._dropped_total += len(victims)
            return
        lapsed = [v for v in victims if v.lease_deadline is not None and v.lease_deadline <= now]
        kept = [v for v in victims if not (v.lease_deadline is not None and v.lease_deadline <= now)]
        known = [v for v in kept if v.block_hash in host.index]
        down = [v for v in kept if v.block_hash not in host.index]
        host.index.touch_chain([v.block_hash for v in reversed(known)])
        room = min(len(down), host.pool.free_count + host.index.evictable_count)
        down, lost = down[:room], down[room:]
        pages, _ = self._allocate_host(len(down), protect=[], what="demote")
        self._mover.move(self._pool, [v.page for v in down], host.pool, pages)
        for entry, page in zip(down, pages):
            host.index.insert(BlockEntry(entry.block_hash, page, entry.family, entry.parent))
        self._demoted_total += len(down)
        self._dropped_total += len(lost) + sum(1 for v in lapsed if v.block_hash not in host.index)
        self._emit_runs(EventType.STORED, Tier.HOST, down[::-1])  # victims go tail first; events list chains head first

"""The store's same-host shared-memory side (KVStoreCore composes this):
which tiers a local peer may map (shm/arena.py), the pages of blocks it
reads there, the pages of a reservation it writes there, and the commit that
checks what it wrote.

Reading: map_blocks pins each block in the tier a peer reads it from (the
first shared tier holding it) under a lease, and names its page. A pinned
page is never freed or rewritten (index.py: pinned blocks are not evicted),
so the peer's copy is consistent as long as it finishes before the lease
lapses; it then calls unpin (or lets the lease lapse). The peer measures the
lease from before its call, so its own clock ends it first.

Writing: reserve as for any replica, then reservation_pages names the pages
(a reservation's pages are in no index and no one else writes them until it
closes); the peer writes canonical blocks into them and commits with the
crc32c of each chunk it declares. commit_shared checksums those ranges of the
pool (and keeps the segment checksums, so a later replication from here
reads nothing twice), refuses a mismatch (nothing published, pages freed)
and commits as usual: visible only after commit, as on every other path.

A writer that checksummed every segment it wrote while the bytes were hot
and compared them with its source's (a kvstore replicating here,
shm_target.py) sends those segment checksums with the commit: they are kept
as the pages' checksums and the chunk checksums are folded from them, so
the target does not read its pages a second time. The check is then the
writer's: the boundary is the OS user that may map the pool at all
(shm/arena.py), so nothing a same-user writer says is less trusted than the
bytes it can write.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.ids import BlockHash
from speckv.services.common.tiers import Tier
from speckv.services.kvstore import validate
from speckv.services.kvstore.pool import PageId
from speckv.services.kvstore.reservations import Handle
from speckv.services.kvstore.shm.arena import ArenaAddress
from speckv.services.kvstore.shm.backend import arena_of

if TYPE_CHECKING:
    from speckv.services.kvstore.store import KVStoreCore
    from speckv.services.kvstore.tier import StoreTier


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a block's bytes lie for a local reader: page of tier's arena."""

    tier: Tier
    page: PageId


class SharedPages:
    """KVStoreCore's shared-memory endpoints (a base of KVStoreCore only)."""

    def shared_arenas(self: KVStoreCore) -> dict[Tier, ArenaAddress]:
        """The tiers whose pools live in shared memory, with their arenas."""
        found = {}
        for tier in self._tiers():
            address = arena_of(tier.pool.backend)
            if address is not None:
                found[tier.tier] = address
        return found

    def map_blocks(self: KVStoreCore, hashes: Sequence[int], lease_s: float, prefix: bool = False) -> list[Placement]:
        """Pins every block for lease_s seconds (released by unpin) and says
        where each lies; NotFound names blocks not resident, FailedPrecondition
        blocks held only in private memory (a device pool). prefix: the
        longest resident prefix of hashes instead (possibly empty), no
        NotFound. Nothing is pinned when it raises."""
        wanted = validate.hash_list(hashes, "map_blocks", self.max_hashes)
        validate.lease(lease_s, "map_blocks lease_s")
        self._stage_from_disk(wanted)  # blocks only the disk holds come up into the host tier's shared pool
        with self._lock:
            if prefix:
                held = next((i for i, h in enumerate(wanted) if not self._holds(h)), len(wanted))
                wanted = wanted[:held]
                if not wanted:
                    return []
            self._require_resident(wanted, "map_blocks")
            places = [self._shared_place(h) for h in wanted]
            private = [h for h, place in zip(wanted, places) if place is None]
            if private:
                raise FailedPrecondition(
                    f"map_blocks: blocks only in private memory: {validate.quote(private)}; read them with GetBlocks")
            self.pin(wanted, lease_s)
            return places  # type: ignore[return-value]

    def _shared_place(self: KVStoreCore, h: BlockHash) -> Placement | None:
        for tier in self._tiers():
            entry = tier.index.get(h)
            if entry is not None and arena_of(tier.pool.backend) is not None:
                return Placement(tier.tier, entry.page)
        return None

    def host_pools(self: KVStoreCore) -> dict[Tier, np.ndarray]:
        """The pool arrays of the tiers in host memory (what a NIXL agent
        registers, nixl/agent.py), shared or not."""
        return {tier.tier: tier.pool.data for tier in self._tiers() if tier.pool.zero_copy}

    def reservation_pages(self: KVStoreCore, handle: str, shared: bool = True) -> tuple[Tier, list[PageId]]:
        """The tier and pages of a live reservation, in reserved block order;
        FailedPrecondition when that tier is not in shared memory (shared) or
        not in host memory (not shared: a NIXL writer's)."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._reap()
            tier = self._book_of(handle)
            if not shared and not tier.pool.zero_copy:
                raise FailedPrecondition(f"reservation {handle} is in {tier.medium} memory not in the host")
            if shared and arena_of(tier.pool.backend) is None:
                raise FailedPrecondition(f"reservation {handle} is in {tier.medium} memory that is not shared")
            reservation = tier.book.check_live(Handle(handle))
            return tier.tier, list(reservation.pages)

    def copy_source(self: KVStoreCore, tier: Tier, pages: Sequence[PageId]) -> tuple[np.ndarray, np.ndarray]:
        """For a same-host writer copying pages out of tier (held pinned by
        the caller): the pool array and the pages' segment checksums
        [len(pages), 2 * num_layers] (cached ones; the rest computed now)."""
        with self._lock:
            pool = self._tier(tier, "copy_source").pool
            if not pool.zero_copy:
                raise FailedPrecondition(f"copy_source: the {tier.medium} pool is not in host memory")
            return pool.data, pool.pages_crcs(pages)

    def commit_shared(self: KVStoreCore, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float,
                      segment_crcs: Sequence[int] = (), landed: bool = False) -> int:
        """Commits a reservation written through shared memory: chunk_crcs
        (offset -> crc32c) must cut the whole reservation into chunks (each
        ends where the next offset starts, the last at its end) and match the
        bytes now in its pages; otherwise Aborted, nothing published.
        segment_crcs: the writer's checksum of every segment it wrote (2 *
        num_layers per block, in order); kept as the pages' checksums, so the
        match is folded from them instead of read from the pages. landed:
        chunks already checked as they landed (a NIXL writer's batches,
        nixl/landing.py) are not read again; the others are."""
        validate.identifier(handle, "handle")
        if replica_lease_s < 0 or not math.isfinite(replica_lease_s):
            raise InvalidArgument(f"replica_lease_s={replica_lease_s}: must be >= 0")
        with self._lock:
            self._reap()
            tier = self._book_of(handle)
            if len(segment_crcs):
                pages = tier.book.check_live(Handle(handle)).pages
                per_block = 2 * self.geometry.num_layers
                if len(segment_crcs) != len(pages) * per_block:
                    raise InvalidArgument(f"commit of {handle}: {len(segment_crcs)} segment checksums for "
                                          f"{len(pages)} blocks of {per_block} segments")
                tier.pool.crcs.record_pages(pages, np.asarray(segment_crcs, dtype=np.uint32).reshape(-1, per_block))
            tier.book.accept_shared(Handle(handle), dict(chunk_crcs), lambda pages, lo, size: _range_crc(
                tier, pages, lo, size), landed=landed)
            return tier.book.commit(Handle(handle), dict(chunk_crcs), replica_lease_s)


def _range_crc(tier: StoreTier, pages: Sequence[PageId], offset: int, size: int) -> int:
    """crc32c of bytes [offset, offset+size) of pages' canonical blocks, read
    from the pool (the pages' segment checksums are kept for later reads)."""
    pool = tier.pool
    spans = pool.spans(pages, offset, size)
    if spans is not None:
        return pool.spans_crc(spans)
    return pool.range_crc(pool.pieces(pages, offset, size))

"""Both ends of replication in one node's store (KVStoreCore, store.py,
composes this): the target side reserves pages in a tier, takes the chunks
(staged, or zero-copy into reserved host pages), and commits or aborts; at
commit the reserved blocks are published into the tier's index as replicas
carrying a lease (tail first, so LRU takes the tail first once the lease
lapses: index.py). The source side holds blocks pinned while their bytes
are read (hold, pages_of, source_chunk).

The store's lock, tiers, allocation (writeback.py) and residency helpers
are KVStoreCore's; every method here takes the lock as the store's do.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.ids import BlockHash, OrderId
from speckv.services.common.tiers import Tier
from speckv.services.kvstore import validate
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.index import BlockEntry
from speckv.services.kvstore.pool import Buffer, PageId
from speckv.services.kvstore.records import ZeroCopyWrite
from speckv.services.kvstore.reservations import Grant, Handle, Reservation


if TYPE_CHECKING:
    from speckv.services.kvstore.store import KVStoreCore

class ReplicaSides:
    """KVStoreCore's replication endpoints (a base of KVStoreCore only)."""

    # ---- target side of replication ----------------------------------
    def reserve(
        self: KVStoreCore, order_id: str, hashes: Sequence[int], lease_s: float, *, family: str = "",
        parent: BlockHash | None = None, source_node: str = "", tier: Tier = Tier.DEVICE,
        engine_save: bool = False,
    ) -> Grant:
        """Holds pages of tier for the hashes this node holds in no tier
        (evicting if needed); FailedPrecondition when it has no such tier.
        engine_save: the node's own engine's KV (its commit publishes STORED)."""
        validate.identifier(order_id, "order_id")
        wanted = validate.hash_list(hashes, "reserve", self.max_hashes, unique=True)
        validate.lease(lease_s, "lease_s")
        with self._lock:
            target = self._tier(tier, f"reserve for order {order_id}")
            self._reap()
            parents = [parent, *wanted[:-1]]
            needed = [(h, p) for h, p in zip(wanted, parents) if not self._holds(h)]
            present = [h for h in wanted if h in target.index]
            allocate = self._allocate if target is self._device else self._allocate_host
            pages, _ = allocate(len(needed), protect=present, what=f"reserve for order {order_id}")
            reservation = target.book.open(
                OrderId(order_id), [h for h, _ in needed], pages, lease_s, parents=[p for _, p in needed],
                family=family, parent=parent, source_node=source_node, engine_save=engine_save)
            self._settle_retention()
            return Grant(reservation.handle, tuple(reservation.hashes), self.bytes_per_block, reservation.deadline)

    def check_write(self: KVStoreCore, handle: str, offset: int, size: int) -> None:
        """Raises unless a chunk of size bytes at offset may go to handle (a
        live reservation, inside it); changes nothing but reaping."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._reap()
            self._book_of(handle).book.check(Handle(handle), offset, size)

    def write_chunk(self: KVStoreCore, handle: str, offset: int, data: Buffer, crc32c: int, actual_crc: int | None = None) -> int:
        """actual_crc: crc32c of data when the caller computed it already."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._reap()
            return self._book_of(handle).book.write(Handle(handle), offset, data, crc32c, actual_crc)

    def begin_write(self: KVStoreCore, handle: str, offset: int, size: int) -> ZeroCopyWrite | None:
        """Checks like check_write; on a host pool also registers a zero-copy
        write and returns the views of the reserved pages to fill. None on a
        device pool: stage the bytes and call write_chunk instead."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._reap()
            tier = self._book_of(handle)
            if not tier.pool.zero_copy:
                tier.book.check(Handle(handle), offset, size)
                return None
            reservation = tier.book.begin_write(Handle(handle), offset, size)
            spans = tier.pool.spans(reservation.pages, offset, size)  # in range: checked above
            if spans is not None:
                return ZeroCopyWrite(reservation, offset, size, spans, [], tier.pool.span_views(spans))
            pieces = tier.pool.pieces(reservation.pages, offset, size)
            return ZeroCopyWrite(reservation, offset, size, None, pieces, tier.pool.views(pieces))

    def finish_write(self: KVStoreCore, write: ZeroCopyWrite, crc32c: int, actual_crc: int, piece_crcs: Sequence[int]) -> int:
        """Ends a zero-copy write: its bytes had crc32c actual_crc, the sender
        said crc32c; piece_crcs are the crc32c of each of write.pieces, kept
        for the whole segments. Returns the reservation's covered bytes."""
        with self._lock:
            tier = self._book_of(write.reservation.handle)
            covered = tier.book.finish_write(write.reservation, write.offset, write.size, crc32c, actual_crc)
            if write.spans is not None:
                tier.pool.crcs.record_spans(write.spans, piece_crcs)
            for piece, crc in zip(write.pieces, piece_crcs):
                if piece.whole:
                    tier.pool.crcs.record(piece.page, piece.segment, crc)
            return covered

    def cancel_write(self: KVStoreCore, write: ZeroCopyWrite) -> None:
        """Ends a zero-copy write that did not complete (abort it too)."""
        with self._lock:
            self._book_of(write.reservation.handle).book.cancel_write(write.reservation, write.offset, write.size)

    def commit(self: KVStoreCore, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int:
        """replica_lease_s 0: the blocks are kept like any other block."""
        validate.identifier(handle, "handle")
        if replica_lease_s < 0:
            raise InvalidArgument(f"replica_lease_s={replica_lease_s}: must be >= 0")
        with self._lock:
            self._reap()
            return self._book_of(handle).book.commit(Handle(handle), dict(chunk_crcs), replica_lease_s)

    def abort(self: KVStoreCore, handle: str, reason: str = "") -> int:
        validate.identifier(handle, "handle")
        with self._lock:
            self._reap()
            return self._book_of(handle).book.abort(Handle(handle), reason)

    # ---- source side of replication -----------------------------------
    @contextmanager
    def hold(self: KVStoreCore, hashes: Sequence[int], what: str = "replicate") -> Iterator[list[BlockHash]]:
        """Pins the blocks, in every tier holding them, for the duration
        (FailedPrecondition naming the ones this node lacks), without
        counting as a use."""
        wanted = validate.hash_list(hashes, what, self.max_hashes)
        self._stage_from_disk(wanted)  # a replica's source on disk is read up into the host tier first
        with self._lock:
            missing = [h for h in wanted if not self._holds(h)]
            if missing:
                raise FailedPrecondition(
                    f"{what}: node {self.node_id} lacks {len(missing)} of {len(wanted)} blocks: "
                    f"{validate.quote(missing)}")
            pinned = self._pin_all(wanted)
        try:
            yield wanted
        finally:
            with self._lock:
                self._unpin_all(pinned)

    def parent_of(self: KVStoreCore, block_hash: BlockHash) -> BlockHash | None:
        """The parent this node recorded for the block (None: a chain's first
        block, or one it does not hold): a copy starting mid-chain carries it,
        so the target publishes the run as a continuation, not a new family."""
        with self._lock:
            for tier in self._tiers():
                entry = tier.index.get(block_hash)
                if entry is not None:
                    return entry.parent
            return None

    def pages_of(self: KVStoreCore, hashes: Sequence[BlockHash]) -> tuple[Tier, list[PageId]] | None:
        """The tier and pages of resident blocks when one tier holds them all
        (the device tier first), else None; the caller holds them pinned."""
        with self._lock:
            self._require_resident(hashes, "pages_of")
            for tier in self._tiers():
                entries = [tier.index.get(h) for h in hashes]
                if all(e is not None for e in entries):
                    return tier.tier, [e.page for e in entries]  # type: ignore[union-attr]
            return None

    @property
    def zero_copy(self: KVStoreCore) -> bool:
        """Whether source_chunk and begin_write views work on the device tier (a host pool)."""
        return self._pool.zero_copy

    def tier_zero_copy(self: KVStoreCore, tier: Tier) -> bool:
        """Whether source_chunk views work on tier (a host pool)."""
        return self._tier(tier, "tier_zero_copy").pool.zero_copy

    def source_chunk(self: KVStoreCore, pages: Sequence[PageId], offset: int, length: int,
                     tier: Tier = Tier.DEVICE) -> tuple[list[memoryview], int]:
        """Views of canonical bytes [offset, offset+length) of pages' blocks
        in tier (pinned by the caller, so they stay put and unchanged) and
        their crc32c, folded from cached segment checksums (host pools only)."""
        with self._lock:
            pool = self._tier(tier, "source_chunk").pool
            spans = pool.spans(pages, offset, length)
            if spans is not None:
                return pool.span_views(spans), pool.spans_crc(spans)
            pieces = pool.pieces(pages, offset, length)
            return pool.views(pieces), pool.range_crc(pieces)

    def _publish(self: KVStoreCore, tier: Tier, reservation: Reservation, replica_lease_s: float) -> int:
        """Book callback at commit: index the reserved blocks in tier, emit
        COMMITTED (STORED for the engine's own save: it is computed here, not
        landed by an order). A hash that became resident in that tier
        meanwhile keeps its copy; ours is freed."""
        target = self._tier(tier, "commit")
        lease = self.clock.now() + replica_lease_s if replica_lease_s > 0 else None
        published: list[BlockHash] = []
        # Tail first, so that once the lease lapses LRU takes the tail first (index.py).
        for h, page, parent in reversed(list(zip(reservation.hashes, reservation.pages, reservation.parents))):
            if h in target.index:
                target.pool.free([page])
                continue
            target.index.insert(BlockEntry(h, page, reservation.family, parent, lease_deadline=lease))
            published.append(h)
        published.reverse()
        if published:
            if reservation.engine_save:
                self._events.append(EventType.STORED, tuple(published), parent=reservation.parent,
                                    family=reservation.family, medium=tier.medium)
            else:
                self._committed_total += len(published)
                self._events.append(EventType.COMMITTED, tuple(published), parent=reservation.parent,
                                    family=reservation.family, order_id=reservation.order_id, medium=tier.medium)
        return len(published)

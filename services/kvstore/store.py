"""KVStoreCore: one node's KV store, composing the pool, the index, the event
log and the reservation book behind one lock.

Invariants:
- every page is in exactly one of: the free stack, the index (visible), an
  open reservation (invisible until commit), or a put being written under the
  lock (never observable);
- a request that fails changes nothing already stored: inputs are validated
  and room is found (evicting only as many blocks as needed, never pinned
  ones, never blocks the request itself names) before anything is written;
- every state change that readers care about is appended to the event log
  while the lock is held, so event order is state order.

Thread-safe: every public method takes the lock. Byte copies run under it too
(a block is at most a few MiB: tens to hundreds of microseconds), except the
zero-copy data plane's socket reads and sends: begin_write hands out views of
reserved pages that the reservation book keeps from being freed until
finish_write / cancel_write, and source_chunk hands out views of pages the
caller holds pinned (hold), so neither can be reused underneath.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from speckv.kernels.backend import Backend
from speckv.services.common.clock import Clock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import BlockHash, OrderId
from speckv.services.kvstore import validate
from speckv.services.kvstore.dataplane.segments import Piece, Span
from speckv.services.kvstore.events import EventLog, EventType, KVEvent
from speckv.services.kvstore.index import BlockEntry, BlockIndex
from speckv.services.kvstore.pool import Buffer, PageId, PagePool
from speckv.services.kvstore.reservations import Grant, Handle, Reservation, ReservationBook


@dataclass(slots=True)
class BlockWrite:
    block_hash: BlockHash
    data: Buffer  # canonical bytes, bytes_per_block long
    family: str = ""
    parent: BlockHash | None = None


@dataclass(frozen=True, slots=True)
class ZeroCopyWrite:
    """A chunk being received straight into reserved pages: write `views`
    (in order, `size` bytes in all), then finish_write or cancel_write."""

    reservation: Reservation
    offset: int
    size: int
    spans: list[Span] | None  # whole segments (the common case), or
    pieces: list[Piece]  # segment pieces, when the range cuts segments
    views: list[memoryview]


@dataclass(slots=True)
class PutResult:
    stored: int
    already_present: int
    evicted: int


@dataclass(slots=True)
class LookupResult:
    present: list[bool]
    prefix_blocks: int


@dataclass(slots=True)
class StoreStats:
    node_id: str
    geometry: KVGeometry
    num_pages: int
    used_pages: int  # not free: resident + reserved
    free_pages: int
    pinned_pages: int
    reserved_pages: int
    replica_pages: int  # speculative replicas still carrying a lease
    evictable_pages: int  # resident and unpinned
    pool_bytes: int
    last_event_sequence: int
    open_reservations: int
    blocks_stored_total: int
    blocks_evicted_total: int
    blocks_committed_total: int

    @property
    def available_pages(self) -> int:
        """Pages a new request could get: free plus evictable."""
        return self.free_pages + self.evictable_pages


class KVStoreCore:
    def __init__(
        self, node_id: str, geometry: KVGeometry, num_pages: int, clock: Clock, *,
        event_retention: int = 100_000, max_hashes_per_request: int = 65_536, backend: Backend | None = None,
    ) -> None:
        """backend: where the pool lives (None: host memory through NumPy)."""
        self.node_id = validate.identifier(node_id, "node_id")
        self.geometry = geometry
        self.clock = clock
        self.max_hashes = max_hashes_per_request
        self._lock = threading.RLock()
        self._pool = PagePool(geometry, num_pages, backend)
        self._index = BlockIndex()
        self._events = EventLog(node_id, geometry.block_size, event_retention, clock)
        self._book = ReservationBook(self._pool, clock, self._publish, prefix=node_id)
        self._stored_total = self._evicted_total = self._committed_total = 0

    @property
    def bytes_per_block(self) -> int:
        return self.geometry.bytes_per_block

    # ---- queries ------------------------------------------------------
    def lookup(self, hashes: Sequence[int]) -> LookupResult:
        """Which hashes are resident; hits count as uses (LRU, lease)."""
        wanted = validate.hash_list(hashes, "lookup", self.max_hashes)
        with self._lock:
            present = [h in self._index for h in wanted]
            self._index.touch_chain([h for h, hit in zip(wanted, present) if hit])
            return LookupResult(present, self._index.longest_prefix(wanted))

    def get_blocks(self, hashes: Sequence[int]) -> Iterator[tuple[BlockHash, np.ndarray]]:
        """Validates and pins every hash now (NotFound names the missing ones),
        then yields (hash, canonical bytes) in request order. The yielded array
        is reused: it is valid until the next item is requested. Pins are
        dropped when the generator ends or is closed."""
        wanted = validate.hash_list(hashes, "get_blocks", self.max_hashes)
        with self._lock:
            self._require_resident(wanted, "get_blocks")
            for h in wanted:
                self._index.pin(h)
            self._index.touch_chain(wanted)
        return self._read_pinned(wanted)

    def _read_pinned(self, wanted: list[BlockHash]) -> Iterator[tuple[BlockHash, np.ndarray]]:
        buffer = np.empty(self.bytes_per_block, dtype=np.uint8)
        try:
            for h in wanted:
                self.pack([h], buffer)
                yield h, buffer
        finally:
            with self._lock:
                for h in reversed(wanted):  # back into the LRU tail first (index.py)
                    self._index.unpin(h)

    def pack(self, hashes: Sequence[BlockHash], out: Buffer) -> None:
        """Canonical bytes of resident blocks into out, without counting as a
        use (replication reads). The caller keeps them pinned."""
        with self._lock:
            self._require_resident(hashes, "pack")
            self._pool.pack([self._index.get(h).page for h in hashes], out)  # type: ignore[union-attr]

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                self.node_id, self.geometry, self._pool.num_pages,
                self._pool.num_pages - self._pool.free_count, self._pool.free_count,
                self._index.pinned_count, self._book.reserved_pages, self._index.replica_count,
                self._index.evictable_count, self._pool.nbytes, self._events.last_sequence,
                len(self._book), self._stored_total, self._evicted_total, self._committed_total)

    def subscribe(self, after_sequence: int, keep_going: Callable[[], bool] = lambda: True,
                  poll_s: float = 0.5) -> Iterator[KVEvent]:
        if after_sequence < 0:
            raise InvalidArgument(f"after_sequence={after_sequence}: must be >= 0")
        return self._events.subscribe(after_sequence, self._snapshot, keep_going, poll_s)

    def _snapshot(self) -> tuple[list[BlockHash], int]:
        with self._lock:
            return self._index.hashes(), self._events.last_sequence

    # ---- writes -------------------------------------------------------
    def put_blocks(self, blocks: Sequence[BlockWrite]) -> PutResult:
        """Stores the blocks not yet resident; resident ones count as uses."""
        hashes = validate.hash_list([b.block_hash for b in blocks], "put_blocks",
                                    min(self.max_hashes, self._pool.num_pages), unique=True)
        for i, block in enumerate(blocks):
            size = block.data.nbytes if hasattr(block.data, "nbytes") else len(block.data)  # type: ignore[union-attr]
            if size != self.bytes_per_block:
                raise InvalidArgument(
                    f"put_blocks: block {i} (hash {block.block_hash}) has {size} bytes, "
                    f"expected bytes_per_block={self.bytes_per_block}")
        with self._lock:
            fresh = [b for b in blocks if b.block_hash not in self._index]
            present = [h for h in hashes if h in self._index]
            pages, evicted = self._allocate(len(fresh), protect=present, what="put_blocks")
            for block, page in zip(fresh, pages):
                self._pool.unpack(block.data, [page])
                self._pool.seal([page])  # segment checksums now, while the bytes are hot
                self._index.insert(BlockEntry(block.block_hash, page, block.family, block.parent))
            self._index.touch_chain(hashes)  # the fresh ones too: the head ends most recent
            self._stored_total += len(fresh)
            self._emit_stored(fresh)
            return PutResult(len(fresh), len(present), evicted)

    def pin(self, hashes: Sequence[int]) -> int:
        wanted = validate.hash_list(hashes, "pin", self.max_hashes)
        with self._lock:
            self._require_resident(wanted, "pin")
            for h in wanted:
                self._index.pin(h)
            self._index.touch_chain(wanted)
            return len(wanted)

    def unpin(self, hashes: Sequence[int]) -> int:
        wanted = validate.hash_list(hashes, "unpin", self.max_hashes)
        with self._lock:
            self._require_resident(wanted, "unpin")
            asked: dict[BlockHash, int] = {}
            for h in wanted:
                asked[h] = asked.get(h, 0) + 1
            short = [h for h, n in asked.items() if self._index.get(h).pins < n]  # type: ignore[union-attr]
            if short:
                raise FailedPrecondition(f"unpin: blocks not pinned (that many times): {validate.quote(short)}")
            for h in reversed(wanted):  # back into the LRU tail first (index.py)
                self._index.unpin(h)
            return len(wanted)

    # ---- target side of replication ----------------------------------
    def reserve(
        self, order_id: str, hashes: Sequence[int], lease_s: float, *, family: str = "",
        parent: BlockHash | None = None, source_node: str = "",
    ) -> Grant:
        """Holds pages for the hashes this node lacks (evicting if needed)."""
        validate.identifier(order_id, "order_id")
        wanted = validate.hash_list(hashes, "reserve", self.max_hashes, unique=True)
        validate.lease(lease_s, "lease_s")
        with self._lock:
            self._book.reap()
            parents = [parent, *wanted[:-1]]
            needed = [(h, p) for h, p in zip(wanted, parents) if h not in self._index]
            present = [h for h in wanted if h in self._index]
            pages, _ = self._allocate(len(needed), protect=present, what=f"reserve for order {order_id}")
            reservation = self._book.open(
                OrderId(order_id), [h for h, _ in needed], pages, lease_s, parents=[p for _, p in needed],
                family=family, parent=parent, source_node=source_node)
            return Grant(reservation.handle, tuple(reservation.hashes), self.bytes_per_block, reservation.deadline)

    def check_write(self, handle: str, offset: int, size: int) -> None:
        """Raises unless a chunk of size bytes at offset may go to handle (a
        live reservation, inside it); changes nothing but reaping."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._book.reap()
            self._book.check(Handle(handle), offset, size)

    def write_chunk(self, handle: str, offset: int, data: Buffer, crc32c: int, actual_crc: int | None = None) -> int:
        """actual_crc: crc32c of data when the caller computed it already."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._book.reap()
            return self._book.write(Handle(handle), offset, data, crc32c, actual_crc)

    def begin_write(self, handle: str, offset: int, size: int) -> ZeroCopyWrite | None:
        """Checks like check_write; on a host pool also registers a zero-copy
        write and returns the views of the reserved pages to fill. None on a
        device pool: stage the bytes and call write_chunk instead."""
        validate.identifier(handle, "handle")
        with self._lock:
            self._book.reap()
            if not self._pool.zero_copy:
                self._book.check(Handle(handle), offset, size)
                return None
            reservation = self._book.begin_write(Handle(handle), offset, size)
            spans = self._pool.spans(reservation.pages, offset, size)  # in range: checked above
            if spans is not None:
                return ZeroCopyWrite(reservation, offset, size, spans, [], self._pool.span_views(spans))
            pieces = self._pool.pieces(reservation.pages, offset, size)
            return ZeroCopyWrite(reservation, offset, size, None, pieces, self._pool.views(pieces))

    def finish_write(self, write: ZeroCopyWrite, crc32c: int, actual_crc: int, piece_crcs: Sequence[int]) -> int:
        """Ends a zero-copy write: its bytes had crc32c actual_crc, the sender
        said crc32c; piece_crcs are the crc32c of each of write.pieces, kept
        for the whole segments. Returns the reservation's covered bytes."""
        with self._lock:
            covered = self._book.finish_write(write.reservation, write.offset, write.size, crc32c, actual_crc)
            if write.spans is not None:
                self._pool.crcs.record_spans(write.spans, piece_crcs)
            for piece, crc in zip(write.pieces, piece_crcs):
                if piece.whole:
                    self._pool.crcs.record(piece.page, piece.segment, crc)
            return covered

    def cancel_write(self, write: ZeroCopyWrite) -> None:
        """Ends a zero-copy write that did not complete (abort it too)."""
        with self._lock:
            self._book.cancel_write(write.reservation, write.offset, write.size)

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int:
        """replica_lease_s 0: the blocks are kept like any other block."""
        validate.identifier(handle, "handle")
        if replica_lease_s < 0:
            raise InvalidArgument(f"replica_lease_s={replica_lease_s}: must be >= 0")
        with self._lock:
            self._book.reap()
            return self._book.commit(Handle(handle), dict(chunk_crcs), replica_lease_s)

    def abort(self, handle: str, reason: str = "") -> int:
        validate.identifier(handle, "handle")
        with self._lock:
            self._book.reap()
            return self._book.abort(Handle(handle), reason)

    # ---- source side of replication -----------------------------------
    @contextmanager
    def hold(self, hashes: Sequence[int], what: str = "replicate") -> Iterator[list[BlockHash]]:
        """Pins the blocks for the duration (FailedPrecondition naming the
        ones this node lacks), without counting as a use."""
        wanted = validate.hash_list(hashes, what, self.max_hashes)
        with self._lock:
            missing = [h for h in wanted if h not in self._index]
            if missing:
                raise FailedPrecondition(
                    f"{what}: node {self.node_id} lacks {len(missing)} of {len(wanted)} blocks: "
                    f"{validate.quote(missing)}")
            for h in wanted:
                self._index.pin(h)
        try:
            yield wanted
        finally:
            with self._lock:
                for h in wanted:
                    self._index.unpin(h)

    def pages_of(self, hashes: Sequence[BlockHash]) -> list[PageId]:
        """The pages of resident blocks (the caller holds them pinned)."""
        with self._lock:
            self._require_resident(hashes, "pages_of")
            return [self._index.get(h).page for h in hashes]  # type: ignore[union-attr]

    @property
    def zero_copy(self) -> bool:
        """Whether source_chunk and begin_write views work (a host pool)."""
        return self._pool.zero_copy

    def source_chunk(self, pages: Sequence[PageId], offset: int, length: int) -> tuple[list[memoryview], int]:
        """Views of canonical bytes [offset, offset+length) of pages' blocks
        (pinned by the caller, so they stay put and unchanged) and their
        crc32c, folded from cached segment checksums (host pools only)."""
        with self._lock:
            spans = self._pool.spans(pages, offset, length)
            if spans is not None:
                return self._pool.span_views(spans), self._pool.spans_crc(spans)
            pieces = self._pool.pieces(pages, offset, length)
            return self._pool.views(pieces), self._pool.range_crc(pieces)

    # ---- housekeeping ---------------------------------------------------
    def maintenance(self) -> int:
        """Reaps lapsed reservations (freeing their pages); returns how many."""
        with self._lock:
            return self._book.reap()

    def close(self) -> None:
        """Ends every event subscription."""
        self._events.close()

    # ---- internals (lock held) ------------------------------------------
    def _require_resident(self, hashes: Sequence[BlockHash], what: str) -> None:
        missing = [h for h in dict.fromkeys(hashes) if h not in self._index]
        if missing:
            raise NotFound(f"{what}: unknown block hashes on node {self.node_id}: {validate.quote(missing)}")

    def _allocate(self, count: int, protect: Sequence[BlockHash], what: str) -> tuple[list[PageId], int]:
        """count pages, evicting as few blocks as needed but none of protect.
        Raises ResourceExhausted, changing nothing, when that is impossible."""
        shortfall = count - self._pool.free_count
        if shortfall <= 0:
            return self._pool.alloc(count), 0
        shielded = sum(1 for h in protect if self._index.get(h).pins == 0)  # type: ignore[union-attr]
        evictable = self._index.evictable_count - shielded
        if evictable < shortfall:
            raise ResourceExhausted(
                f"{what}: needs {count} pages but only {self._pool.free_count} are free and {evictable} "
                f"evictable ({self._index.pinned_count} pinned, {self._book.reserved_pages} reserved, "
                f"{self._pool.num_pages} in all)")
        for h in protect:
            self._index.pin(h)
        try:
            victims = [self._index.pop_victim(self.clock.now()) for _ in range(shortfall)]
        finally:
            for h in protect:
                self._index.unpin(h)
        self._pool.free([v.page for v in victims])  # type: ignore[union-attr]
        self._evicted_total += len(victims)
        self._events.append(EventType.REMOVED, tuple(v.block_hash for v in victims))  # type: ignore[union-attr]
        return self._pool.alloc(count), len(victims)

    def _publish(self, reservation: Reservation, replica_lease_s: float) -> int:
        """Book callback at commit: index the reserved blocks, emit COMMITTED.
        A hash that became resident meanwhile keeps its copy; ours is freed."""
        lease = self.clock.now() + replica_lease_s if replica_lease_s > 0 else None
        published: list[BlockHash] = []
        # Tail first, so that once the lease lapses LRU takes the tail first (index.py).
        for h, page, parent in reversed(list(zip(reservation.hashes, reservation.pages, reservation.parents))):
            if h in self._index:
                self._pool.free([page])
                continue
            self._index.insert(BlockEntry(h, page, reservation.family, parent, lease_deadline=lease))
            published.append(h)
        published.reverse()
        if published:
            self._committed_total += len(published)
            self._events.append(EventType.COMMITTED, tuple(published), parent=reservation.parent,
                                family=reservation.family, order_id=reservation.order_id)
        return len(published)

    def _emit_stored(self, fresh: Sequence[BlockWrite]) -> None:
        """One STORED event per run of blocks that chain (parent = previous
        block, same family), like vLLM's BlockStored."""
        run: list[BlockWrite] = []
        for block in fresh:
            if run and not (block.parent == run[-1].block_hash and block.family == run[-1].family):
                self._append_stored(run)
                run = []
            run.append(block)
        if run:
            self._append_stored(run)

    def _append_stored(self, run: list[BlockWrite]) -> None:
        self._events.append(EventType.STORED, tuple(b.block_hash for b in run),
                            parent=run[0].parent, family=run[0].family)

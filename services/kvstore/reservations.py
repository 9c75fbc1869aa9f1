"""Target half of the RDMA-style replication handshake.

  reserve  pages are allocated for the blocks the target lacks and named by a
           handle with a lease deadline (like a registered memory region);
  write    chunks land straight in the reserved pages at a byte offset of the
           reservation (blocks in reserved order, canonical layout); chunks
           may come in any order, but each byte once: a chunk overlapping
           bytes already written is ALREADY_EXISTS and changes nothing (so a
           replayed write capability cannot replace what the source sent,
           issue 43); each renews the lease.
           Either in one call (write: the bytes are copied in under the
           store lock) or zero-copy (begin_write, then the caller receives
           straight into the pages outside the lock, then finish_write or
           cancel_write). While such a write is in progress the reservation
           has a writer: closing it (abort, expiry, bad crc) marks it closed
           at once but frees its pages only when the last writer is done, so
           pages are never reused under a socket read; commit refuses;
  commit   succeeds only if every byte arrived and the writer's per-chunk
           crc32c map equals what was received; only then are the blocks
           published in the index (the store's publish callback);
  abort    frees the pages; nothing is published.

Nothing half-written is ever visible: reserved pages are in no index until
commit. A reservation whose lease lapses is reaped (on every call here and by
the store's maintenance) and frees its pages. A chunk whose crc32c does not
match its bytes aborts the whole reservation (the writer's stream is broken
anyway; it must start over). Closed handles are remembered (bounded) so a late
chunk is told ABORTED rather than NOT_FOUND, and a repeated commit returns the
first answer.

Not thread-safe: the store serializes every call.
"""
from __future__ import annotations

import bisect
import itertools
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, NewType, Sequence

from speckv.services.common.clock import Clock
from speckv.services.common.errors import Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.ids import BlockHash, OrderId
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.pool import Buffer, PageId, PagePool

Handle = NewType("Handle", str)
MAX_TOMBSTONES = 4096


class ReservationState(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    EXPIRED = "expired"


class Intervals:
    """Union of half-open byte ranges, kept sorted and merged."""

    __slots__ = ("_starts", "_ends")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self._ends, lo)  # first range that may touch [lo, hi)
        j = bisect.bisect_right(self._starts, hi)  # ranges from i to j-1 touch it
        if i < j:
            lo, hi = min(lo, self._starts[i]), max(hi, self._ends[j - 1])
        self._starts[i:j] = [lo]
        self._ends[i:j] = [hi]

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether any byte of [lo, hi) is in the union."""
        i = bisect.bisect_right(self._ends, lo)  # the first range ending after lo
        return i < len(self._starts) and self._starts[i] < hi

    def covered(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends))

    def gaps(self, total: int) -> list[tuple[int, int]]:
        """Missing ranges of [0, total)."""
        gaps, pos = [], 0
        for s, e in zip(self._starts, self._ends):
            if s > pos:
                gaps.append((pos, s))
            pos = max(pos, e)
        if pos < total:
            gaps.append((pos, total))
        return gaps


@dataclass(slots=True)
class Reservation:
    """Pages held for hashes, in reserved order (page i holds hashes[i])."""

    handle: Handle
    order_id: OrderId
    hashes: list[BlockHash]
    pages: list[PageId]
    lease_s: float
    deadline: float  # node clock, seconds
    parents: list[BlockHash | None] = field(default_factory=list)  # chain parent of each hash
    family: str = ""
    parent: BlockHash | None = None  # parent of the order's first block
    source_node: str = ""
    bytes_per_block: int = 0
    received: Intervals = field(default_factory=Intervals)
    chunk_crcs: dict[int, int] = field(default_factory=dict)  # offset -> crc32c as received
    writing: list[tuple[int, int]] = field(default_factory=list)  # zero-copy writes in progress, [lo, hi)
    engine_save: bool = False  # the node's own engine's KV: published as STORED, not as a replica's COMMITTED

    @property
    def writers(self) -> int:
        return len(self.writing)

    def check_no_overlap(self, lo: int, hi: int) -> None:
        """Bytes being written zero-copy must not be written by anyone else."""
        for w_lo, w_hi in self.writing:
            if lo < w_hi and w_lo < hi:
                raise FailedPrecondition(
                    f"chunk {lo}+{hi - lo} of {self.handle} overlaps a chunk still being written ({w_lo}..{w_hi})")

    @property
    def total_bytes(self) -> int:
        return len(self.hashes) * self.bytes_per_block


@dataclass(frozen=True, slots=True)
class Closed:
    """What became of a handle that is no longer open."""

    state: ReservationState
    detail: str
    committed: int = 0


@dataclass(frozen=True, slots=True)
class Grant:
    """What a reserve returns to the writer: send bytes for `hashes` (those the
    target lacks, in this order) at offsets i * bytes_per_block."""

    handle: Handle
    hashes: tuple[BlockHash, ...]
    bytes_per_block: int
    deadline_s: float  # target clock
    data_address: str = ""  # the target's TCP data plane, host:port; "": WriteChunks only
    capability: bytes = b""  # write capability (write_gate.py) to present with every write; b"": none asked
    secret: bytes = b""  # the capability's secret, proven on the TCP data plane (dataplane/possession.py)
    pages: tuple[int, ...] = ()  # asked for shared memory: the page of each of hashes in pool pages_medium
    pages_medium: str = ""
    pages_token: str = ""  # the shared arena of pages_medium (shm/arena.py)


# publish(reservation, replica_lease_s) -> blocks newly made visible; it takes
# over the reservation's pages (freeing those it does not publish).
PublishFn = Callable[[Reservation, float], int]
# crc_of(pages, offset, size) -> crc32c of those bytes of the pages' canonical blocks.
RangeCrc = Callable[[Sequence[PageId], int, int], int]


class ReservationBook:
    def __init__(self, pool: PagePool, clock: Clock, publish: PublishFn, prefix: str = "r") -> None:
        self._pool = pool
        self._clock = clock
        self._publish = publish
        self._prefix = prefix
        self._open: dict[Handle, Reservation] = {}
        self._closed: OrderedDict[Handle, Closed] = OrderedDict()
        self._draining: dict[Handle, Reservation] = {}  # closed, pages held until writers finish
        self._serial = itertools.count(1)
        self.reserved_pages = 0

    def __len__(self) -> int:
        return len(self._open)

    def open(
        self, order_id: OrderId, hashes: Sequence[BlockHash], pages: Sequence[PageId], lease_s: float, *,
        parents: Sequence[BlockHash | None] = (), family: str = "", parent: BlockHash | None = None,
        source_node: str = "", engine_save: bool = False,
    ) -> Reservation:
        """Registers pages already allocated (by the store, evicting as needed)
        for hashes; the book owns them from now on."""
        handle = Handle(f"{self._prefix}-{next(self._serial)}-{secrets.token_hex(6)}")
        reservation = Reservation(
            handle, order_id, list(hashes), list(pages), lease_s, self._clock.now() + lease_s,
            list(parents) or [None] * len(hashes), family, parent, source_node, self._pool.bytes_per_block,
            engine_save=engine_save)
        self._open[handle] = reservation
        self.reserved_pages += len(pages)
        return reservation

    def check(self, handle: Handle, offset: int, size: int) -> Reservation:
        """The live reservation a chunk of size bytes at offset may be written
        to; raises (NotFound, Aborted, InvalidArgument) otherwise. The data
        plane calls this before it accepts a chunk's payload."""
        reservation = self._live(handle)
        if size <= 0:
            raise InvalidArgument(f"chunk at offset {offset} of {handle} is empty")
        if offset < 0 or offset + size > reservation.total_bytes:
            raise InvalidArgument(
                f"chunk {offset}+{size} outside reservation {handle} of {reservation.total_bytes} bytes")
        if reservation.received.overlaps(offset, offset + size):
            # Written once: a second writer (a replayed capability) must not replace bytes the source sent.
            raise AlreadyExists(f"chunk {offset}+{size} of {handle} overlaps bytes already written; each byte of "
                                "a reservation is written once (nothing changed)")
        return reservation

    def write(self, handle: Handle, offset: int, data: Buffer, checksum: int, actual: int | None = None) -> int:
        """Stores one chunk; returns the reservation's covered byte count.
        actual: the crc32c of data if the caller already computed it (the data
        plane does, piece by piece while the bytes are hot in cache)."""
        size = len(data) if not hasattr(data, "nbytes") else data.nbytes  # type: ignore[union-attr]
        reservation = self.check(handle, offset, size)
        reservation.check_no_overlap(offset, offset + size)
        actual = crc32c(data) if actual is None else actual
        if actual != checksum:
            self._close(reservation, ReservationState.ABORTED, f"chunk at offset {offset} failed its crc32c")
            raise Aborted(f"chunk at offset {offset} of {handle}: crc32c {actual:#010x} != sent "
                          f"{checksum:#010x}; reservation aborted")
        self._pool.write_range(reservation.pages, offset, data)
        reservation.received.add(offset, offset + size)
        reservation.chunk_crcs[offset] = checksum
        reservation.deadline = self._clock.now() + reservation.lease_s
        return reservation.received.covered()

    def begin_write(self, handle: Handle, offset: int, size: int) -> Reservation:
        """Registers a zero-copy write of [offset, offset+size): the caller may
        then write those bytes of reservation.pages without the store lock,
        and must end with finish_write or cancel_write."""
        reservation = self.check(handle, offset, size)
        reservation.check_no_overlap(offset, offset + size)
        reservation.writing.append((offset, offset + size))
        return reservation

    def finish_write(self, reservation: Reservation, offset: int, size: int, checksum: int, actual: int) -> int:
        """Ends a zero-copy write whose bytes had crc32c `actual`; records it
        like write. Raises Aborted (pages freed) on a crc mismatch or if the
        reservation was closed meanwhile."""
        self._release(reservation, offset, size)
        reservation = self._live(reservation.handle)
        if actual != checksum:
            self._close(reservation, ReservationState.ABORTED, f"chunk at offset {offset} failed its crc32c")
            raise Aborted(f"chunk at offset {offset} of {reservation.handle}: crc32c {actual:#010x} != sent "
                          f"{checksum:#010x}; reservation aborted")
        reservation.received.add(offset, offset + size)
        reservation.chunk_crcs[offset] = checksum
        reservation.deadline = self._clock.now() + reservation.lease_s
        return reservation.received.covered()

    def cancel_write(self, reservation: Reservation, offset: int, size: int) -> None:
        """Ends a zero-copy write that failed (its bytes are garbage: the
        caller aborts the reservation too)."""
        self._release(reservation, offset, size)

    def _release(self, reservation: Reservation, offset: int, size: int) -> None:
        reservation.writing.remove((offset, offset + size))  # ValueError: a bug (no such write)
        if not reservation.writing and self._draining.pop(reservation.handle, None) is not None:
            self._free(reservation)

    def check_live(self, handle: Handle) -> Reservation:
        """The open reservation of handle; Aborted or NotFound otherwise."""
        return self._live(handle)

    def accept_shared(self, handle: Handle, chunk_crcs: dict[int, int], crc_of: RangeCrc,
                      landed: bool = False) -> None:
        """Records chunks a same-host peer wrote straight into the pages
        (shared memory): chunk_crcs' offsets must cut the reservation into
        contiguous chunks from 0 to its end, and crc_of(pages, offset, size)
        of each must equal the peer's; otherwise the reservation is aborted.
        landed: some chunks were already checked as they landed (a NIXL
        writer's batches, nixl/landing.py): those are skipped here (commit
        compares their checksums), only the others are read; a chunk that
        overlaps checked bytes without being one is refused."""
        reservation = self._live(handle)
        if reservation.writers or (reservation.chunk_crcs and not landed):
            raise FailedPrecondition(f"reservation {handle} was written over another data plane; commit it there")
        offsets = sorted(chunk_crcs)
        total = reservation.total_bytes
        if total and (not offsets or offsets[0] != 0 or offsets[-1] >= total):
            raise InvalidArgument(f"chunk offsets of {handle} must start at 0 and lie inside its {total} bytes")
        if not total and offsets:
            raise InvalidArgument(f"reservation {handle} holds no bytes; send no chunk checksums")
        for lo, hi in zip(offsets, [*offsets[1:], total]):
            if lo in reservation.chunk_crcs:
                continue  # checked as it landed; commit compares the checksums and finds any bytes left out
            if reservation.received.overlaps(lo, hi):
                self._close(reservation, ReservationState.ABORTED, f"chunk at offset {lo} cuts checked bytes")
                raise Aborted(f"chunk {lo}..{hi} of {handle} overlaps bytes checked as another chunk; aborted")
            actual = crc_of(reservation.pages, lo, hi - lo)
            if actual != chunk_crcs[lo]:
                self._close(reservation, ReservationState.ABORTED, f"chunk at offset {lo} failed its crc32c")
                raise Aborted(f"chunk at offset {lo} of {handle}: crc32c {actual:#010x} in the pages != sent "
                              f"{chunk_crcs[lo]:#010x}; reservation aborted")
            reservation.received.add(lo, hi)
            reservation.chunk_crcs[lo] = chunk_crcs[lo]

    def commit(self, handle: Handle, chunk_crcs: dict[int, int], replica_lease_s: float) -> int:
        """Publishes the blocks once complete and verified; returns how many
        became visible (a repeated commit returns the first answer)."""
        closed = self._closed.get(handle)
        if closed is not None and closed.state is ReservationState.COMMITTED:
            return closed.committed
        reservation = self._live(handle)
        if reservation.writers:
            raise FailedPrecondition(f"reservation {handle} has a chunk still being written; commit after END")
        gaps = reservation.received.gaps(reservation.total_bytes)
        if gaps:
            shown = ", ".join(f"{lo}..{hi}" for lo, hi in gaps[:5])
            raise FailedPrecondition(
                f"reservation {handle} is missing {len(gaps)} byte range(s): {shown}")
        if dict(chunk_crcs) != reservation.chunk_crcs:
            detail = _crc_mismatch(chunk_crcs, reservation.chunk_crcs)
            self._close(reservation, ReservationState.ABORTED, f"commit checksums: {detail}")
            raise Aborted(f"reservation {handle}: {detail}; aborted, nothing published")
        published = self._publish(reservation, replica_lease_s)
        self._close(reservation, ReservationState.COMMITTED, "committed", published, free_pages=False)
        return published

    def abort(self, handle: Handle, reason: str) -> int:
        """Frees the pages; returns how many. Aborting twice frees nothing."""
        reservation = self._open.get(handle)
        if reservation is None:
            self._closed_uncommitted(handle)
            return 0
        freed = len(reservation.pages)
        self._close(reservation, ReservationState.ABORTED, reason or "aborted by the writer")
        return freed

    def reap(self) -> int:
        """Expires every reservation whose lease has lapsed; returns how many."""
        now = self._clock.now()
        lapsed = [r for r in self._open.values() if r.deadline <= now]
        for reservation in lapsed:
            self._close(reservation, ReservationState.EXPIRED, f"lease lapsed at {reservation.deadline:.3f}")
        return len(lapsed)

    def _closed_uncommitted(self, handle: Handle) -> Closed:
        """The remembered record of a closed, uncommitted handle; NotFound
        when it was never (or is no longer) known, FailedPrecondition when it
        committed."""
        closed = self._closed.get(handle)
        if closed is None:
            raise NotFound(f"reservation {handle!r} is unknown")
        if closed.state is ReservationState.COMMITTED:
            raise FailedPrecondition(f"reservation {handle} is already committed")
        return closed

    def _live(self, handle: Handle) -> Reservation:
        reservation = self._open.get(handle)
        if reservation is None:
            closed = self._closed_uncommitted(handle)
            raise Aborted(f"reservation {handle} is {closed.state.value}: {closed.detail}")
        if reservation.deadline <= self._clock.now():
            self._close(reservation, ReservationState.EXPIRED, f"lease lapsed at {reservation.deadline:.3f}")
            raise Aborted(f"reservation {handle} expired (lease lapsed at {reservation.deadline:.3f})")
        return reservation

    def _close(self, reservation: Reservation, state: ReservationState, detail: str,
               committed: int = 0, free_pages: bool = True) -> None:
        del self._open[reservation.handle]
        if not free_pages:
            self.reserved_pages -= len(reservation.pages)  # handed over to the index
        elif reservation.writers:
            self._draining[reservation.handle] = reservation  # freed by the last writer
        else:
            self._free(reservation)
        self._closed[reservation.handle] = Closed(state, detail, committed)
        while len(self._closed) > MAX_TOMBSTONES:
            self._closed.popitem(last=False)


    def _free(self, reservation: Reservation) -> None:
        self.reserved_pages -= len(reservation.pages)
        self._pool.free(reservation.pages)


def _crc_mismatch(sent: dict[int, int], received: dict[int, int]) -> str:
    missing = sorted(set(received) - set(sent))
    unknown = sorted(set(sent) - set(received))
    wrong = sorted(o for o in set(sent) & set(received) if sent[o] != received[o])
    parts = []
    if wrong:
        parts.append(f"crc32c differs at offsets {wrong[:5]}")
    if missing:
        parts.append(f"no crc32c sent for offsets {missing[:5]}")
    if unknown:
        parts.append(f"crc32c for offsets never written {unknown[:5]}")
    return "; ".join(parts)

"""Reads of block records at the drive's speed, every one checked.

A drive reaches its rate only with large requests and several in flight
(one 4 KiB-to-block-size read at a time is how LMCache's raw disk backend
read 1.2 GB/s from an 11 GB/s drive, its issue #4697). So a read of n
records cuts each record into as few requests as request_bytes allows
(default 1 MiB, so 1-2 MiB each; near-equal ALIGN multiples) into
page-aligned buffers, and `depth` threads issue them as positional reads
(os.preadv releases the GIL), so up to `depth` requests are in flight at
once (read() says how records are spread over the threads). No io_uring: no maintained binding is
installed here, and a thread pool of preadv reaches the drive's ceiling
(docs/disk.md has the figures).

Every record read is checked (records.py's validity rule) and classed:
OK (served), CORRUPT (torn or damaged: a miss, never served), FOREIGN
(a valid record of another layout digest: never served) or EMPTY (no
record: a slot never written).
"""
from __future__ import annotations

import enum
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import RecordMedium
from speckv.services.kvstore.disk.records import ALIGN, RecordHeader

MIB = 1 << 20
DEFAULT_REQUEST_BYTES = MIB
DEFAULT_DEPTH = 4


class Outcome(enum.Enum):
    OK = "ok"
    CORRUPT = "corrupt"
    FOREIGN = "foreign"
    EMPTY = "empty"


@dataclass(slots=True)
class RecordRead:
    slot: int
    outcome: Outcome
    header: RecordHeader | None
    record: np.ndarray  # the whole record; payload: records.payload_of

    @property
    def payload(self) -> np.ndarray:
        assert self.header is not None
        return records.payload_of(self.record, self.header.payload_len)


class RecordReader:
    """Parallel, checked reads of whole records (thread-safe: each call
    uses its own buffers; the pool is shared)."""

    def __init__(self, medium: RecordMedium, digest: bytes, payload_len: int, *,
                 request_bytes: int = DEFAULT_REQUEST_BYTES, depth: int = DEFAULT_DEPTH) -> None:
        if request_bytes <= 0 or request_bytes % ALIGN:
            raise ValueError(f"request_bytes={request_bytes}: must be a positive multiple of {ALIGN}")
        if depth < 1:
            raise ValueError(f"depth={depth}: must be >= 1")
        self._medium, self._digest, self._payload_len = medium, digest, payload_len
        self.request_bytes, self.depth = request_bytes, depth
        # depth requests in flight at most (the semaphore); twice the threads, so checks run beside them
        self._in_flight = threading.BoundedSemaphore(depth)
        self._pool = ThreadPoolExecutor(2 * depth, thread_name_prefix="disk-read")

    def read(self, slots: Sequence[int], buffers: Sequence[np.ndarray] | None = None) -> list[RecordRead]:
        """The records in slots, read and checked, in order. buffers: one
        aligned record-sized buffer per slot to read into (None: new ones).
        At least `depth` records: one task per record (its requests, then
        its check, on one thread), `depth` requests in flight across the
        2 x depth threads, so the checks run beside the next reads instead of in
        their place (the crc32c package releases the GIL while it checks).
        Fewer records: their requests spread over the threads and the caller
        checks."""
        size = self._medium.record_bytes
        buffers = list(buffers) if buffers is not None else [records.aligned_buffer(size) for _ in slots]
        cuts = self._cuts(size)
        if len(buffers) >= self.depth:
            return list(self._pool.map(lambda slot, buffer: self._read_one(slot, buffer, cuts), slots, buffers))
        pending = [[self._pool.submit(self._request, slot * size + at, buffer[at:at + n]) for at, n in cuts]
                   for slot, buffer in zip(slots, buffers)]
        return [self._check(slot, buffer, all(f.result() == n for f, (_, n) in zip(futures, cuts)))
                for slot, buffer, futures in zip(slots, buffers, pending)]

    def _read_one(self, slot: int, buffer: np.ndarray, cuts: list[tuple[int, int]]) -> RecordRead:
        base = slot * self._medium.record_bytes
        whole = all(self._request(base + at, buffer[at:at + n]) == n for at, n in cuts)
        return self._check(slot, buffer, whole)

    def _request(self, offset: int, into: np.ndarray) -> int:
        with self._in_flight:
            return self._medium.read(offset, into)

    def _cuts(self, size: int) -> list[tuple[int, int]]:
        """(offset, length) of a record's requests: as few as request_bytes
        allows, of near-equal ALIGN-multiple lengths (a 2 MiB + 4 KiB record at
        1 MiB: 1 MiB + 4 KiB and 1 MiB, not a third 4 KiB request)."""
        count = -(-size // self.request_bytes)
        step = records.align_up(-(-size // count))
        return [(at, min(step, size - at)) for at in range(0, size, step)]

    def scan(self, batch: int = 64) -> Iterator[RecordRead]:
        """Every slot's record, read and checked, in slot order (re-indexing
        at start: the whole medium read once at full speed)."""
        buffers = [records.aligned_buffer(self._medium.record_bytes) for _ in range(min(batch, self._medium.slots))]
        for start in range(0, self._medium.slots, batch):
            slots = range(start, min(start + batch, self._medium.slots))
            yield from self.read(slots, buffers[:len(slots)])

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _check(self, slot: int, record: np.ndarray, whole: bool) -> RecordRead:
        header = records.decode_header(record) if whole else None
        if header is None:
            empty = whole and not record[:len(records.MAGIC)].any()
            return RecordRead(slot, Outcome.EMPTY if empty else Outcome.CORRUPT, None, record)
        if header.digest != self._digest:
            return RecordRead(slot, Outcome.FOREIGN, header, record)
        if header.payload_len != self._payload_len or not records.payload_valid(record, header):
            return RecordRead(slot, Outcome.CORRUPT, header, record)
        return RecordRead(slot, Outcome.OK, header, record)

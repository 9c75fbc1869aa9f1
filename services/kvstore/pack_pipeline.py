"""Source-side pack pipeline: a packer thread fills staging buffers while the
transport sends the previous one, so packing chunk i+1 overlaps sending
chunk i (NumPy copies, crc32c... and socket sends release the GIL or are
short, so the two really run on two cores).

Algorithm: blocks are packed group by group, a group being
max(1, chunk_bytes // bytes_per_block) blocks, into one of `depth` (2)
staging buffers allocated and touched once per transfer. A packed group is
cut into chunks of at most chunk_bytes (chunks never straddle a group) and
each chunk's crc32c is computed by the packer. The consumer iterates chunks;
a chunk's data is a view of the staging buffer, valid until the consumer asks
for a chunk of a later group (then that buffer goes back to the packer).
Closing the iterator early stops the packer; a packer error is re-raised in
the consumer.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from speckv.services.common.ids import BlockHash
from speckv.services.kvstore.checksum import crc32c

PackFn = Callable[[Sequence[BlockHash], np.ndarray], None]  # canonical bytes of blocks into a buffer
POLL_S = 0.05  # how often a blocked packer checks that the consumer still wants it


@dataclass(frozen=True, slots=True)
class PackedChunk:
    offset: int  # bytes into the transfer
    data: np.ndarray  # uint8 view of a staging buffer
    crc32c: int


@dataclass(slots=True)
class _Group:
    buffer: np.ndarray
    chunks: list[PackedChunk]


_DONE = object()


def pipelined_chunks(pack: PackFn, hashes: Sequence[BlockHash], bytes_per_block: int, chunk_bytes: int,
                     depth: int = 2) -> Iterator[PackedChunk]:
    """The chunks of hashes' canonical bytes, in offset order (see module doc)."""
    per_group = max(1, chunk_bytes // bytes_per_block)
    free: queue.Queue[np.ndarray] = queue.Queue()
    for _ in range(depth):
        free.put(np.ones(min(len(hashes), per_group) * bytes_per_block, dtype=np.uint8))  # touched now
    full: queue.Queue[object] = queue.Queue()
    stop = threading.Event()

    def packer() -> None:
        try:
            for first in range(0, len(hashes), per_group):
                buffer = _take(free, stop)
                if buffer is None:
                    return
                group = hashes[first:first + per_group]
                pack(group, buffer)
                size = len(group) * bytes_per_block
                chunks = [PackedChunk(first * bytes_per_block + lo, buffer[lo:min(size, lo + chunk_bytes)],
                                      crc32c(buffer[lo:min(size, lo + chunk_bytes)]))
                          for lo in range(0, size, chunk_bytes)]
                full.put(_Group(buffer, chunks))
            full.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            full.put(exc)

    thread = threading.Thread(target=packer, name="replication-packer", daemon=True)
    thread.start()
    try:
        while True:
            item = full.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, _Group)
            yield from item.chunks
            free.put(item.buffer)
    finally:
        stop.set()
        thread.join()


def _take(free: "queue.Queue[np.ndarray]", stop: threading.Event) -> np.ndarray | None:
    while not stop.is_set():
        try:
            return free.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return None

"""A data plane connection's checking thread: the crc32c and MAC of each chunk
received straight into pool pages, computed on another thread while the
connection's own thread receives the next chunk.

Why a thread: on the receiving side the kernel's copy out of the socket runs
with the GIL released, and the checksum of the bytes that landed (plus the
chunk's GMAC with data_plane_auth on) costs about half as much again
(docs/journal/dataplane.md, 2026-12-06). Done in line, the two add up; done
here, the check of chunk k runs beside the receive of chunk k+1, on whatever
core is free.

Invariants (the receiver's, unchanged): a chunk is recorded (finish_write)
only after its crc32c matched the sender's and, where keyed, its tag
verified; a chunk that fails is cancelled (cancel_write) and its error is
raised on the connection's thread at its next submit, collect or settle, which
then answers it and aborts every reservation the connection wrote to. At
most one chunk is being checked at a time (depth one: the pages of at most
two chunks are in flight per connection). Every write handed over is ended,
finished or cancelled, by this thread; settle() waits for that, so nothing
is aborted or answered while a write is still open here.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
from speckv.services.kvstore.checksum import combine, fold
from speckv.services.kvstore.checksum import crc32c as value
from speckv.services.kvstore.dataplane import possession
from speckv.services.kvstore.records import ZeroCopyWrite

frombuffer = np.frombuffer


class WriteEnds(Protocol):
    """The two ends of a zero-copy write (KVStoreCore satisfies it)."""

    def finish_write(self, write: ZeroCopyWrite, crc32c: int, actual_crc: int, piece_crcs: list[int]) -> int: ...

    def cancel_write(self, write: ZeroCopyWrite) -> None: ...


@dataclass(slots=True)
class Landed:
    """A chunk whose payload (and tag) have been received into write.views.
    key: its MAC key (None: no MAC asked); tag: the tag the sender presented."""

    write: ZeroCopyWrite
    handle: str
    offset: int
    crc32c: int  # the sender's, from the frame header
    key: bytes | None
    tag: bytes


def check_landed(sink: WriteEnds, job: Landed) -> int:
    """Checksums (and MACs) job's views, then ends the write: finish_write
    (which raises Aborted on a crc32c mismatch) or, on any failure, cancel.
    Returns the reservation's covered bytes."""
    write = job.write
    try:
        views = write.views
        piece_crcs = [value(frombuffer(view, np.uint8)) for view in views]  # value refuses memoryviews
        crc = _chunk_crc(views, piece_crcs)
        if job.key is not None:
            mac = possession.ChunkMac(job.key, job.handle, job.offset, write.size, job.crc32c)
            for view in views:  # still in this core's cache from the crc pass
                mac.update(view)
            possession.check_tag(mac, job.tag, job.handle, job.offset)
    except BaseException:
        sink.cancel_write(write)
        raise
    return sink.finish_write(write, job.crc32c, crc, piece_crcs)


def _chunk_crc(views: list[memoryview], piece_crcs: list[int]) -> int:
    """crc32c of the views' bytes, folded from theirs."""
    size = len(views[0]) if views else 0
    if all(len(view) == size for view in views):  # whole segments: the common case
        return fold(0, piece_crcs, size)
    crc = 0
    for view, piece in zip(views, piece_crcs):
        crc = combine(crc, piece, len(view))
    return crc


class Checker:
    """The checking thread of one connection, started on the first chunk
    submitted. Only the connection's thread calls its methods. on_covered is
    called there with (handle, covered bytes) for each chunk that passed."""

    def __init__(self, sink: WriteEnds, on_covered: Callable[[str, int], None], name: str = "data-check") -> None:
        self._sink = sink
        self._on_covered = on_covered
        self._name = name
        self._jobs: queue.SimpleQueue[Landed | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[str, int, BaseException | None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pending = False

    def submit(self, job: Landed) -> None:
        """Hands job over once the previous chunk's check is in (its error,
        if any, is raised here, and job's write is then cancelled)."""
        try:
            self.collect()
        except BaseException:
            self._sink.cancel_write(job.write)
            raise
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(job)
        self._pending = True

    def collect(self) -> None:
        """Waits for the chunk being checked, if any; raises its error."""
        if not self._pending:
            return
        handle, covered, error = self._results.get()
        self._pending = False
        if error is not None:
            raise error
        self._on_covered(handle, covered)

    @property
    def pending(self) -> bool:
        """Whether a chunk is being checked."""
        return self._pending

    def error_or(self, error: BaseException) -> BaseException:
        """The pending chunk's failure if it failed (the cause a later step
        tripped over), else error; settles either way."""
        try:
            self.collect()
        except BaseException as failed:  # noqa: BLE001 - returned to the caller, who raises it
            return failed
        return error

    def settle(self) -> None:
        """Like collect, but a failed chunk's error is dropped (the caller is
        already failing the connection); its write was ended either way."""
        try:
            self.collect()
        except BaseException:  # noqa: BLE001 - cancelled and reported by the caller's own failure
            pass

    def close(self) -> None:
        """Settles and stops the thread."""
        self.settle()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._results.put((job.handle, check_landed(self._sink, job), None))
            except BaseException as exc:  # noqa: BLE001 - handed to the connection's thread
                self._results.put((job.handle, 0, exc))

"""Where the disk tier's records live, behind one small interface
(RecordMedium) so the store never touches a file itself: FileMedium (a
preallocated file under --disk-dir, direct I/O) for the kvstore, and
MemoryMedium (the same slots in RAM) for tests and for the simulator, which
charges each read and write in virtual time from its byte count instead of
waiting on a drive.

A medium is an array of `slots` fixed-size records of `record_bytes` each
(records.py); slot i starts at byte i * record_bytes. Reads and writes are
positional, whole ALIGN multiples at ALIGN offsets, from and into ALIGN
aligned buffers, so FileMedium can use O_DIRECT; several may run at once
from different threads (pread/pwrite share no file offset).
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
from pathlib import Path
from typing import Protocol

import numpy as np

from speckv.services.kvstore.disk.records import ALIGN

log = logging.getLogger(__name__)
FILE_NAME = "speckv-blocks.dat"


class RecordMedium(Protocol):
    slots: int
    record_bytes: int
    direct: bool  # reads and writes bypass the page cache

    def read(self, offset: int, into: np.ndarray) -> int:
        """Reads len(into) bytes at byte offset; returns the bytes read."""
        ...

    def write(self, offset: int, data: np.ndarray) -> None:
        """Writes data (whole) at byte offset."""
        ...

    def sync(self) -> None:
        """Makes what was written durable (a batch's end)."""
        ...

    def close(self) -> None:
        ...


class MemoryMedium:
    """Records in RAM: the same contract as FileMedium without a file (the
    simulator's disk; a test's). Survives nothing."""

    direct = False

    def __init__(self, slots: int, record_bytes: int) -> None:
        self.slots, self.record_bytes = slots, record_bytes
        self._data = np.zeros(slots * record_bytes, dtype=np.uint8)

    def read(self, offset: int, into: np.ndarray) -> int:
        n = max(0, min(len(into), len(self._data) - offset))
        into[:n] = self._data[offset:offset + n]
        return n

    def write(self, offset: int, data: np.ndarray) -> None:
        self._data[offset:offset + len(data)] = data

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class FileMedium:
    """One file of slots * record_bytes bytes under directory, preallocated
    (posix_fallocate) so writes never extend it, opened with O_DIRECT; where
    the filesystem refuses O_DIRECT (tmpfs) it is opened buffered and one
    warning line says so. A file left by an earlier run is kept (its records
    are what re-indexing reads) and resized to this capacity."""

    def __init__(self, directory: Path, slots: int, record_bytes: int) -> None:
        if record_bytes % ALIGN:
            raise ValueError(f"record_bytes={record_bytes}: not a multiple of {ALIGN}")
        self.slots, self.record_bytes = slots, record_bytes
        self.path = Path(directory) / FILE_NAME
        size = slots * record_bytes
        self._fd, self.direct = open_direct(self.path)
        try:
            if os.fstat(self._fd).st_size > size:
                os.ftruncate(self._fd, size)
            if size:
                os.posix_fallocate(self._fd, 0, size)
        except OSError:
            os.close(self._fd)
            raise

    def read(self, offset: int, into: np.ndarray) -> int:
        return os.preadv(self._fd, [into], offset)

    def write(self, offset: int, data: np.ndarray) -> None:
        view, at = memoryview(data).cast("B"), 0
        while at < len(view):
            at += os.pwritev(self._fd, [view[at:]], offset + at)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _direct_reads(fd: int) -> bool:
    """Whether an aligned read works on fd (some filesystems take the
    O_DIRECT open and refuse the I/O with EINVAL)."""
    probe = np.frombuffer(mmap.mmap(-1, ALIGN), dtype=np.uint8)
    try:
        os.preadv(fd, [probe], 0)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    return True


def open_direct(path: Path) -> tuple[int, bool]:
    """(fd, direct): O_DIRECT where the filesystem takes it, else buffered."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            fd = os.open(path, flags | direct, 0o600)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        else:
            if _direct_reads(fd):
                return fd, True
            os.close(fd)
    log.warning("disk tier: %s refuses O_DIRECT; using buffered I/O (reads go through the page cache)", path.parent)
    return os.open(path, flags, 0o600), False

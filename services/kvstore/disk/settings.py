"""The kvstore's disk flags checked before anything is opened: every error
names the flag (--disk-dir, --disk-bytes, ...) and what it needs.

The rules: --disk-dir and --disk-bytes come together (a directory with 0
bytes, or bytes without a directory, is an error); the directory exists, is
a directory and is writable; --disk-bytes is a positive multiple of one
block record (records.record_bytes: a 4 KiB header and the block rounded up
to 4 KiB) and fits the filesystem's free space (counting the file a previous
run left there); a disk tier needs a host tier (--host-pages > 0) above it;
--disk-request-kib is a positive multiple of 4 KiB, --disk-depth and
--disk-queue-blocks are >= 1.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol

from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import FILE_NAME


class DiskFlags(Protocol):
    disk_dir: str
    disk_bytes: int
    disk_request_kib: int
    disk_depth: int
    disk_queue_blocks: int
    host_pages: int


def check_disk(flags: DiskFlags, bytes_per_block: int) -> int:
    """The disk tier's slots (0: no disk tier); InvalidArgument names the flag."""
    if flags.disk_bytes < 0:
        raise InvalidArgument(f"--disk-bytes={flags.disk_bytes}: must be >= 0")
    if not flags.disk_dir:
        if flags.disk_bytes:
            raise InvalidArgument(f"--disk-bytes={flags.disk_bytes}: needs --disk-dir (where the disk tier lives)")
        return 0
    if flags.disk_bytes == 0:
        raise InvalidArgument(f"--disk-dir={flags.disk_dir}: needs --disk-bytes > 0 (the disk tier's capacity)")
    size = records.record_bytes(bytes_per_block)
    if flags.disk_bytes % size:
        raise InvalidArgument(
            f"--disk-bytes={flags.disk_bytes}: not a multiple of one block record ({size} bytes: a 4096-byte "
            f"header and the {bytes_per_block}-byte block rounded up to 4096); e.g. "
            f"{max(1, flags.disk_bytes // size) * size}")
    if flags.host_pages <= 0:
        raise InvalidArgument(f"--disk-dir={flags.disk_dir}: a disk tier needs a host tier above it (--host-pages > 0)")
    if flags.disk_request_kib <= 0 or flags.disk_request_kib % 4:
        raise InvalidArgument(f"--disk-request-kib={flags.disk_request_kib}: must be a positive multiple of 4")
    for name in ("disk_depth", "disk_queue_blocks"):
        if getattr(flags, name) < 1:
            raise InvalidArgument(f"--{name.replace('_', '-')}={getattr(flags, name)}: must be >= 1")
    _check_directory(Path(flags.disk_dir), flags.disk_bytes)
    return flags.disk_bytes // size


def _check_directory(directory: Path, nbytes: int) -> None:
    if not directory.exists():
        raise InvalidArgument(f"--disk-dir={directory}: does not exist (create it first)")
    if not directory.is_dir():
        raise InvalidArgument(f"--disk-dir={directory}: is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidArgument(f"--disk-dir={directory}: is not writable by this process")
    existing = directory / FILE_NAME
    have = existing.stat().st_size if existing.exists() else 0
    free = shutil.disk_usage(directory).free
    if nbytes - have > free:
        raise InvalidArgument(f"--disk-bytes={nbytes}: the filesystem of --disk-dir={directory} has only "
                              f"{free + have} bytes for it")

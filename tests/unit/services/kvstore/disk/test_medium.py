"""Record media: the file is preallocated and opened O_DIRECT where the
filesystem allows it (ext4 here), buffered with one warning where it does
not (tmpfs); the in-memory medium keeps the same contract."""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import numpy as np
from speckv.services.kvstore.disk import medium as medium_module
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import FILE_NAME, FileMedium, MemoryMedium

SIZE = records.record_bytes(512)


def roundtrip(medium) -> None:
    data = records.aligned_buffer(SIZE)
    data[:] = np.arange(SIZE, dtype=np.uint64).astype(np.uint8)
    medium.write(2 * SIZE, data)
    medium.sync()
    back = records.aligned_buffer(SIZE)
    assert medium.read(2 * SIZE, back) == SIZE and (back == data).all()


def test_a_file_is_preallocated_and_read_back(tmp_path: Path):
    medium = FileMedium(tmp_path, 4, SIZE)
    try:
        assert (tmp_path / FILE_NAME).stat().st_size == 4 * SIZE
        roundtrip(medium)
    finally:
        medium.close()
    again = FileMedium(tmp_path, 2, SIZE)  # a smaller capacity keeps the file's head
    again.close()
    assert (tmp_path / FILE_NAME).stat().st_size == 2 * SIZE


def test_direct_io_where_the_filesystem_takes_it(tmp_path: Path, caplog):
    with caplog.at_level(logging.WARNING):
        medium = FileMedium(tmp_path, 2, SIZE)
    medium.close()
    assert medium.direct != ("refuses O_DIRECT" in caplog.text)  # direct, or buffered and said so


def test_a_refused_o_direct_falls_back_to_buffered_io_with_one_warning(tmp_path: Path, caplog, monkeypatch):
    # No filesystem on this machine refuses O_DIRECT (tmpfs takes it on this kernel), so the refusal is
    # the one thing made up here: an open with O_DIRECT fails with EINVAL, as it does on older tmpfs.
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(medium_module.os, "open", refusing_open)
    with caplog.at_level(logging.WARNING):
        buffered = FileMedium(tmp_path, 2, SIZE)
    try:
        assert not buffered.direct and caplog.text.count("refuses O_DIRECT") == 1
        roundtrip(buffered)
    finally:
        buffered.close()


def test_memory_medium_keeps_the_same_contract():
    roundtrip(MemoryMedium(4, SIZE))

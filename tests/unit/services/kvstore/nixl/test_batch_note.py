"""The note of a NIXL batch: what encode writes parse reads back; anything
else a peer might send (another prefix, too long, negative or overflowing
numbers, an empty range) is not a note."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.nixl.batch_note import BatchNote, batch_crcs, parse
from speckv.services.kvstore.nixl.layout import PoolRegion, write_batches


def test_a_note_reads_back_as_written():
    note = BatchNote("r-12-abcdef012345", 8 << 20, 4 << 20, 0xFFFFFFFF)
    assert parse(note.encode()) == note


@pytest.mark.parametrize("message", [
    b"", b"speckv-batch/1", b"speckv-batch/2 r-1 0 1 0", b"speckv-batch/1 r-1 0 1", b"speckv-batch/1 r-1 0 1 0 9",
    b"speckv-batch/1 r-1 -1 1 0", b"speckv-batch/1 r-1 0 0 0", b"speckv-batch/1 r-1 0 1 4294967296",
    b"speckv-batch/1 r-1 18446744073709551616 1 0", b"speckv-batch/1 r-1 0x10 1 0", b"speckv-batch/1  0 1 0",
    b"speckv-batch/1 \xff 0 1 0", b"speckv-batch/1 " + b"r" * 300 + b" 0 1 0",
])
def test_anything_else_is_not_a_note(message):
    assert parse(message) is None


def test_a_batch_checksum_is_the_crc32c_of_its_bytes_in_block_order():
    layers, segment, pages = 2, 64, 5
    pool = np.random.default_rng(3).integers(0, 256, (layers, 2, pages, segment), dtype=np.uint8)
    region = PoolRegion(pool.ctypes.data, pages, layers, segment)
    source_pages = [4, 0, 1, 2]
    segment_crcs = np.array([[crc32c(pool[l, kv, p].tobytes()) for l in range(layers) for kv in range(2)]
                             for p in source_pages], dtype=np.uint32)
    batches = write_batches(region, region, source_pages, [0, 1, 2, 3], 3)
    block = 2 * layers * segment
    crcs = batch_crcs(batches, segment_crcs, block, segment)
    canonical = [pool[:, :, p].tobytes() for p in source_pages]  # (layer, K/V) order within a block
    assert crcs == {0: crc32c(b"".join(canonical[:3])), 3 * block: crc32c(canonical[3])}

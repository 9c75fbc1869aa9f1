"""Checked parallel reads: a record is served only when it checks and
carries the reader's digest; requests are cut to request_bytes."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.geometry import preset
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import MemoryMedium
from speckv.services.kvstore.disk.reader import Outcome, RecordReader
from speckv.services.kvstore.disk.records import HEADER_BYTES, RecordHeader

BPB = 3 * 4096 + 100  # a record of 5 pages: cut into several requests below
SIZE = records.record_bytes(BPB)
DIGEST = records.layout_digest(preset("tiny"))


class CountingMedium(MemoryMedium):
    def __init__(self, slots: int, record_bytes: int) -> None:
        super().__init__(slots, record_bytes)
        self.requests: list[int] = []

    def read(self, offset, into):
        self.requests.append(len(into))
        return super().read(offset, into)


def write(medium, slot: int, block_hash: int, digest: bytes = DIGEST) -> bytes:
    payload = np.random.default_rng(block_hash).integers(0, 256, BPB, dtype=np.uint8)
    out = records.aligned_buffer(SIZE)
    out[HEADER_BYTES:HEADER_BYTES + BPB] = payload
    records.encode_header(RecordHeader(block_hash, digest, block_hash, BPB, records.crc32c(payload)), out)
    medium.write(slot * SIZE, out)
    return payload.tobytes()


def test_records_are_read_in_requests_and_checked():
    medium = CountingMedium(4, SIZE)
    payloads = {slot: write(medium, slot, 100 + slot) for slot in (0, 2)}
    reader = RecordReader(medium, DIGEST, BPB, request_bytes=8192, depth=3)
    try:
        reads = reader.read([2, 0, 1])
    finally:
        reader.close()
    assert [r.outcome for r in reads] == [Outcome.OK, Outcome.OK, Outcome.EMPTY]
    assert reads[0].payload.tobytes() == payloads[2] and reads[0].header.block_hash == 102
    assert reads[1].payload.tobytes() == payloads[0]
    assert sorted(set(medium.requests)) == [4096, 8192] and len(medium.requests) == 3 * 3  # 20 KiB: 8 + 8 + 4


def test_a_damaged_record_is_corrupt_and_another_digest_foreign():
    medium = MemoryMedium(3, SIZE)
    write(medium, 0, 1)
    write(medium, 1, 2, digest=records.layout_digest(preset("llama-3-8b")))
    write(medium, 2, 3)
    medium._data[2 * SIZE + HEADER_BYTES + 7] ^= 0x5A  # one payload byte of slot 2
    reader = RecordReader(medium, DIGEST, BPB)
    try:
        assert [r.outcome for r in reader.scan(batch=2)] == [Outcome.OK, Outcome.FOREIGN, Outcome.CORRUPT]
    finally:
        reader.close()


def test_request_sizes_must_be_aligned():
    with pytest.raises(ValueError, match="multiple of 4096"):
        RecordReader(MemoryMedium(1, SIZE), DIGEST, BPB, request_bytes=1000)

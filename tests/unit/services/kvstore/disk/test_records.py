"""Block records: a header round-trips; a torn header or payload fails its check."""
from __future__ import annotations

import numpy as np

from speckv.services.common.geometry import preset
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.records import HEADER_BYTES, RecordHeader

TINY = preset("tiny")


def record(payload: bytes, block_hash: int = 7, family: str = "fam", parent: int | None = 3) -> np.ndarray:
    out = records.aligned_buffer(records.record_bytes(len(payload)))
    out[HEADER_BYTES:HEADER_BYTES + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    header = RecordHeader(block_hash, records.layout_digest(TINY), 5, len(payload), records.crc32c(payload),
                          parent, family)
    records.encode_header(header, out)
    return out


def test_a_header_round_trips_and_its_payload_checks():
    data = bytes(range(256)) * 2
    out = record(data)
    header = records.decode_header(out)
    assert header == RecordHeader(7, records.layout_digest(TINY), 5, 512, records.crc32c(data), 3, "fam")
    assert records.payload_valid(out, header)
    assert records.decode_header(record(data, parent=None, family="")).parent is None


def test_record_sizes_are_aligned_for_direct_io():
    assert records.record_bytes(512) == 8192 and records.record_bytes(4096) == 8192
    assert records.record_bytes(2 << 20) == (2 << 20) + 4096
    buffer = records.aligned_buffer(8192)
    assert buffer.ctypes.data % records.ALIGN == 0


def test_a_torn_header_or_payload_fails_its_check():
    data = bytes(range(256)) * 2
    torn_header = record(data)
    torn_header[40] ^= 0xFF  # a header byte: its crc no longer matches
    assert records.decode_header(torn_header) is None
    torn_payload = record(data)
    torn_payload[HEADER_BYTES + 100] ^= 0xFF
    header = records.decode_header(torn_payload)
    assert header is not None and not records.payload_valid(torn_payload, header)
    assert records.decode_header(np.zeros(HEADER_BYTES, dtype=np.uint8)) is None  # a slot never written


def test_the_layout_digest_tells_models_apart():
    assert records.layout_digest(TINY) == records.layout_digest(preset("tiny"))
    assert records.layout_digest(TINY) != records.layout_digest(preset("tiny", 32))
    assert records.layout_digest(TINY) != records.layout_digest(preset("llama-3-8b"))

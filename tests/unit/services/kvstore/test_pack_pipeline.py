from __future__ import annotations

import threading

import numpy as np
import pytest

from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.pack_pipeline import pipelined_chunks

BPB = 1000  # bytes per "block": block h is bytes h, h+1, ... mod 256


def pack(hashes, out):
    for i, h in enumerate(hashes):
        out[i * BPB:(i + 1) * BPB] = (np.arange(BPB) + h) % 256


def brute(hashes):
    return b"".join(bytes(((np.arange(BPB) + h) % 256).astype(np.uint8)) for h in hashes)


@pytest.mark.parametrize("count, chunk", [(1, 300), (7, 1000), (7, 2500), (10, 4000), (3, 10_000)])
def test_chunks_rebuild_the_packed_bytes_with_their_crcs(count, chunk):
    hashes = list(range(count))
    seen, expected = bytearray(), brute(hashes)
    for c in pipelined_chunks(pack, hashes, BPB, chunk):
        assert c.offset == len(seen) and 0 < c.data.nbytes <= chunk
        assert c.crc32c == crc32c(expected[c.offset:c.offset + c.data.nbytes])
        seen += bytes(c.data)  # consumed before asking for the next chunk
    assert bytes(seen) == expected


def test_closing_early_stops_the_packer_thread():
    before = threading.active_count()
    chunks = pipelined_chunks(pack, list(range(100)), BPB, BPB)
    next(chunks)
    chunks.close()
    assert threading.active_count() == before


def test_a_packer_error_reaches_the_consumer():
    def failing(hashes, out):
        if hashes[0] >= 2:
            raise KeyError("block vanished")
        pack(hashes, out)

    with pytest.raises(KeyError, match="vanished"):
        list(pipelined_chunks(failing, list(range(5)), BPB, BPB))

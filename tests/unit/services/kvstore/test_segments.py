"""Zero-copy writes into reserved pages (begin_write / finish_write /
cancel_write) and zero-copy reads for the source (source_chunk): bytes land
only for a live handle, nothing half-written is published, and pages are
never freed while a write into them is in progress."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import Aborted, FailedPrecondition, NotFound
from speckv.services.kvstore.checksum import combine, crc32c
from tests.support.kvstore_service import TINY, block_bytes, make_store, read, writes

BPB = TINY.bytes_per_block


def fill(write, data: bytes) -> tuple[int, list[int]]:
    """Copies data into the write's views as a socket would; returns the
    chunk crc folded from per-view crcs, and those crcs."""
    crc, crcs, pos = 0, [], 0
    for view in write.views:
        view[:] = data[pos:pos + len(view)]
        piece = crc32c(data[pos:pos + len(view)])
        crcs.append(piece)
        crc = combine(crc, piece, len(view))
        pos += len(view)
    assert pos == len(data) == write.size
    return crc, crcs


def setup(pages: int = 8):
    clock = ManualClock(100.0)
    return make_store(pages, clock=clock), clock


@pytest.mark.parametrize("offset", [0, 7, 128, BPB - 1])
def test_written_views_commit_to_exact_bytes(offset):
    store, _ = setup()
    grant = store.reserve("o1", [1, 2], 30.0)
    data = block_bytes(1) + block_bytes(2)
    crcs = {}
    for lo, hi in ((offset, 2 * BPB), (0, offset)):
        if hi > lo:
            write = store.begin_write(grant.handle, lo, hi - lo)
            crc, pieces = fill(write, data[lo:hi])
            assert crc == crc32c(data[lo:hi])
            store.finish_write(write, crc, crc, pieces)
            crcs[lo] = crc
    assert store.commit(grant.handle, crcs, 0.0) == 2
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]


def test_abort_during_a_write_frees_the_pages_only_when_the_write_ends():
    store, _ = setup()
    grant = store.reserve("o1", [1, 2], 30.0)
    write = store.begin_write(grant.handle, 0, BPB)
    assert store.abort(grant.handle, "source gave up") == 2
    assert store.stats().free_pages == 6  # still held: the socket may be filling them
    assert store.stats().open_reservations == 0
    fill(write, block_bytes(1))
    with pytest.raises(Aborted, match="aborted"):
        store.finish_write(write, 0, 0, [])
    stats = store.stats()
    assert (stats.free_pages, stats.reserved_pages) == (8, 0)
    assert store.lookup([1, 2]).present == [False, False]


def test_lease_lapsing_during_a_write_frees_after_cancel_and_publishes_nothing():
    store, clock = setup()
    grant = store.reserve("o1", [1], 5.0)
    write = store.begin_write(grant.handle, 0, BPB)
    clock.advance(6.0)
    assert store.maintenance() == 1
    assert store.stats().free_pages == 7
    store.cancel_write(write)
    assert store.stats().free_pages == 8 and store.stats().reserved_pages == 0
    with pytest.raises(Aborted, match="expired"):
        store.begin_write(grant.handle, 0, BPB)


def test_commit_waits_for_writes_in_progress_and_overlaps_are_refused():
    store, _ = setup()
    grant = store.reserve("o1", [1, 2], 30.0)
    data = block_bytes(1) + block_bytes(2)
    first = store.begin_write(grant.handle, 0, BPB)
    with pytest.raises(FailedPrecondition, match="overlaps"):
        store.begin_write(grant.handle, BPB - 1, 2)
    with pytest.raises(FailedPrecondition, match="overlaps"):
        store.write_chunk(grant.handle, 10, data[10:20], crc32c(data[10:20]))
    second = store.begin_write(grant.handle, BPB, BPB)  # disjoint: fine
    crc2, crcs2 = fill(second, data[BPB:])
    store.finish_write(second, crc2, crc2, crcs2)
    with pytest.raises(FailedPrecondition, match="still being written"):
        store.commit(grant.handle, {}, 0.0)
    crc1, crcs1 = fill(first, data[:BPB])
    store.finish_write(first, crc1, crc1, crcs1)
    assert store.commit(grant.handle, {0: crc1, BPB: crc2}, 0.0) == 2
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]


def test_crc_mismatch_at_finish_aborts_and_frees():
    store, _ = setup()
    grant = store.reserve("o1", [1, 2], 30.0)
    write = store.begin_write(grant.handle, 0, BPB)
    crc, crcs = fill(write, block_bytes(1))
    with pytest.raises(Aborted, match="crc32c"):
        store.finish_write(write, crc ^ 1, crc, crcs)
    assert store.stats().free_pages == 8
    with pytest.raises(Aborted):
        store.begin_write(grant.handle, 0, BPB)


def test_unknown_handles_get_no_views():
    store, _ = setup()
    with pytest.raises(NotFound):
        store.begin_write("nope", 0, 1)


def test_received_segment_checksums_serve_the_next_hop():
    """A replica committed from zero-copy writes is a source whose chunk
    checksums come from the segment checksums kept at receive time."""
    store, _ = setup()
    grant = store.reserve("o1", [1, 2], 30.0)
    data = block_bytes(1) + block_bytes(2)
    write = store.begin_write(grant.handle, 0, 2 * BPB)
    crc, crcs = fill(write, data)
    store.finish_write(write, crc, crc, crcs)
    store.commit(grant.handle, {0: crc}, 0.0)
    _, pages = store.pages_of([1, 2])
    assert all(store._pool.crcs.known(p) for p in pages)
    for offset, length in ((0, 2 * BPB), (BPB // 2, BPB), (3, 500)):
        views, chunk_crc = store.source_chunk(pages, offset, length)
        assert b"".join(bytes(v) for v in views) == data[offset:offset + length]
        assert chunk_crc == crc32c(data[offset:offset + length])


def test_put_blocks_seals_checksums_and_source_chunks_match_packed_bytes():
    store, _ = setup()
    store.put_blocks(writes(5, 6, 7))
    _, pages = store.pages_of([5, 6, 7])
    assert all(store._pool.crcs.known(p) for p in pages)
    packed = np.zeros(3 * BPB, dtype=np.uint8)
    store.pack([5, 6, 7], packed)
    views, crc = store.source_chunk(pages, 256, 2 * BPB)
    assert b"".join(bytes(v) for v in views) == packed.tobytes()[256:256 + 2 * BPB]
    assert crc == crc32c(packed[256:256 + 2 * BPB])

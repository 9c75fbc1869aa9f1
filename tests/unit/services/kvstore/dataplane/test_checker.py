"""The per-connection checking thread against a real store: a chunk is
recorded only once its crc32c (and MAC) passed; a failure surfaces on the
connection's thread and leaves no write open."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import Aborted, PermissionDenied
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import possession
from speckv.services.kvstore.dataplane.checker import Checker, Landed
from tests.support.kvstore_service import TINY, block_bytes, make_store

BPB = TINY.bytes_per_block
KEY = bytes(range(32))


def landed(store, handle, offset, data, crc=None, key=None, tag=b""):
    """data written into the reserved pages as the socket would, then handed over."""
    write = store.begin_write(handle, offset, len(data))
    at = 0
    for view in write.views:
        view[:] = data[at:at + len(view)]
        at += len(view)
    return Landed(write, handle, offset, crc32c(data) if crc is None else crc, key, tag)


def test_chunks_pass_one_after_another_and_report_what_they_cover():
    store = make_store(8)
    grant = store.reserve("o1", [1, 2, 3], 30.0, family="f")
    covered = {}
    checker = Checker(store, covered.__setitem__)
    for i, h in enumerate((1, 2, 3)):
        checker.submit(landed(store, grant.handle, i * BPB, block_bytes(h)))
    checker.collect()
    checker.close()
    assert covered == {grant.handle: 3 * BPB}
    crcs = {i * BPB: crc32c(block_bytes(h)) for i, h in enumerate((1, 2, 3))}
    assert store.commit(grant.handle, crcs, 0.0) == 3


def test_a_bad_checksum_is_raised_at_the_next_submit_and_both_writes_end():
    store = make_store(8)
    grant = store.reserve("o1", [1, 2], 30.0, family="f")
    checker = Checker(store, lambda handle, covered: None)
    checker.submit(landed(store, grant.handle, 0, block_bytes(1), crc=12345))
    with pytest.raises(Aborted, match="crc32c"):
        # The first chunk's failure: raised here by submit (the second's write is then cancelled), or, when
        # the checking thread already aborted the reservation, by the second chunk's landing itself.
        checker.submit(landed(store, grant.handle, BPB, block_bytes(2)))
    checker.close()
    stats = store.stats()
    assert stats.reserved_pages == 0 and stats.free_pages == 8 and stats.open_reservations == 0


def test_a_bad_tag_is_refused_before_the_chunk_is_recorded():
    store = make_store(8)
    grant = store.reserve("o1", [1], 30.0, family="f")
    checker = Checker(store, lambda handle, covered: None)
    checker.submit(landed(store, grant.handle, 0, block_bytes(1), key=KEY, tag=bytes(16)))
    assert isinstance(checker.error_or(RuntimeError("unused")), PermissionDenied)
    checker.close()
    # the write was cancelled, not recorded: the connection's abort then frees every page
    with pytest.raises(Exception, match="missing"):
        store.commit(grant.handle, {0: crc32c(block_bytes(1))}, 0.0)
    store.abort(grant.handle, "test")
    assert store.stats().free_pages == 8


def test_a_good_tag_passes():
    store = make_store(8)
    grant = store.reserve("o1", [1], 30.0, family="f")
    data = block_bytes(1)
    mac = possession.ChunkMac(KEY, grant.handle, 0, len(data), crc32c(data))
    mac.update(data)
    covered = {}
    checker = Checker(store, covered.__setitem__)
    checker.submit(landed(store, grant.handle, 0, data, key=KEY, tag=mac.tag()))
    checker.close()
    assert covered == {grant.handle: BPB}
    assert store.commit(grant.handle, {0: crc32c(data)}, 0.0) == 1

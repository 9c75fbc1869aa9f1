"""The TCP data plane's framing and receiver against a real store, over a
real socket pair."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import Aborted, NotFound
from speckv.services.kvstore.dataplane import wire
from tests.support.kvstore_service import TINY, block_bytes, make_store, read, writes
from tests.support.kvstore_wire import serve

BPB = TINY.bytes_per_block


def reserved(store, *hashes):
    return store.reserve("o1", list(hashes), 30.0, family="f")


def test_chunks_for_a_live_handle_land_and_commit_publishes_them():
    store = make_store(8)
    grant = reserved(store, 1, 2, 3)
    data = b"".join(block_bytes(h) for h in (1, 2, 3))
    link = serve(store)
    link.chunk(grant.handle, BPB + 7, data[BPB + 7:])  # out of order, cutting a block
    link.chunk(grant.handle, 0, data[:BPB + 7])
    reply = link.end(grant.handle)
    assert (reply.status, reply.bytes_received) == (wire.OK, 3 * BPB)
    link.close()
    crcs = {0: wire_crc(data[:BPB + 7]), BPB + 7: wire_crc(data[BPB + 7:])}
    assert store.commit(grant.handle, crcs, 0.0) == 3
    assert read(store, 1, 2, 3) == [block_bytes(h) for h in (1, 2, 3)]


def wire_crc(data):
    from speckv.services.kvstore.checksum import crc32c
    return crc32c(data)


def test_many_chunks_in_a_row_land_while_earlier_ones_are_checked():
    store = make_store(16)
    hashes = list(range(1, 13))
    grant = reserved(store, *hashes)
    link = serve(store)
    for i, h in enumerate(hashes):
        link.chunk(grant.handle, i * BPB, block_bytes(h))
    reply = link.end(grant.handle)
    assert (reply.status, reply.bytes_received) == (wire.OK, len(hashes) * BPB)
    link.close()
    crcs = {i * BPB: wire_crc(block_bytes(h)) for i, h in enumerate(hashes)}
    assert store.commit(grant.handle, crcs, 0.0) == len(hashes)
    assert read(store, *hashes) == [block_bytes(h) for h in hashes]


def test_a_bad_checksum_followed_by_good_chunks_is_answered_with_its_own_error():
    store = make_store(8)
    grant = reserved(store, 1, 2, 3)
    link = serve(store)
    link.chunk(grant.handle, 0, block_bytes(1), crc=12345)
    link.chunk(grant.handle, BPB, block_bytes(2))  # sent before the first one's check is in
    link.chunk(grant.handle, 2 * BPB, block_bytes(3))
    reply = link.reply()
    assert reply.status == wire.STATUS_OF_ERROR[Aborted] and "crc32c" in reply.message
    link.close()
    stats = store.stats()
    assert stats.reserved_pages == 0 and stats.free_pages == 8 and stats.open_reservations == 0
    assert store.lookup([1, 2, 3]).present == [False, False, False]


def test_unknown_handle_is_refused_before_its_payload_and_changes_nothing():
    store = make_store(8)
    store.put_blocks(writes(5))
    link = serve(store)
    link.chunk("no-such-handle", 0, block_bytes(1))
    reply = link.reply()
    assert reply.status == wire.STATUS_OF_ERROR[NotFound] and "unknown" in reply.message
    assert reply.bytes_received == 0
    link.close()
    assert store.stats().used_pages == 1 and read(store, 5) == [block_bytes(5)]


def test_bad_checksum_aborts_the_reservation_and_frees_its_pages():
    store = make_store(8)
    grant = reserved(store, 1, 2)
    link = serve(store)
    link.chunk(grant.handle, 0, block_bytes(1) + block_bytes(2), crc=12345)
    reply = link.reply()
    assert reply.status == wire.STATUS_OF_ERROR[Aborted] and "crc32c" in reply.message
    link.close()
    assert store.stats().reserved_pages == 0 and store.stats().free_pages == 8
    assert store.lookup([1, 2]).present == [False, False]
    with pytest.raises(Aborted):
        store.commit(grant.handle, {0: 12345}, 0.0)


def test_short_read_inside_a_payload_aborts_the_reservation():
    store = make_store(8)
    grant = reserved(store, 1, 2)
    data = block_bytes(1) + block_bytes(2)
    link = serve(store)
    link.chunk(grant.handle, 0, data[:BPB])  # a whole chunk lands...
    header = wire.header_buffer()
    link.sock.sendall(wire.encode_header(header, wire.Kind.CHUNK, grant.handle.encode(), BPB, BPB, 0))
    link.sock.sendall(data[BPB:BPB + 100])  # ...then the connection drops 100 bytes into the next
    link.close()
    stats = store.stats()
    assert stats.reserved_pages == 0 and stats.free_pages == 8 and stats.open_reservations == 0
    assert store.lookup([1, 2]).present == [False, False]


def test_connection_closed_before_end_aborts_what_it_wrote():
    store = make_store(8)
    grant = reserved(store, 1)
    link = serve(store)
    link.chunk(grant.handle, 0, block_bytes(1))
    link.close()
    assert store.stats().reserved_pages == 0
    with pytest.raises(Aborted, match="dropped|closed"):
        store.commit(grant.handle, {0: wire_crc(block_bytes(1))}, 0.0)


@pytest.mark.parametrize("offset, length, match", [(BPB, BPB, "outside reservation"), (0, 0, "length")])
def test_bad_ranges_are_invalid_argument(offset, length, match):
    store = make_store(8)
    grant = reserved(store, 1)
    link = serve(store)
    header = wire.header_buffer()
    link.sock.sendall(wire.encode_header(header, wire.Kind.CHUNK, grant.handle.encode(), offset, length, 0))
    reply = link.reply()
    assert reply.status == 3 and match in reply.message
    link.close()
    # A refused frame wrote nothing, so it does not abort a reservation it may
    # not own; the writer's Abort or the lease frees it.
    assert store.stats().reserved_pages == 1 and store.lookup([1]).present == [False]


def test_bad_magic_is_invalid_argument():
    store = make_store(8)
    link = serve(store)
    link.sock.sendall(b"XXXX" + bytes(wire.HEADER.size - 4))
    assert link.reply().status == 3
    link.close()


class StagedSink:
    """The store as a device pool presents it to the receiver: no zero-copy
    views (begin_write only checks), so payloads go through the staging
    buffer and write_chunk, the path a CuPy pool takes."""

    def __init__(self, store) -> None:
        self.store = store

    def begin_write(self, handle, offset, size):
        self.store.check_write(handle, offset, size)
        return None

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_staged_path_lands_chunks_and_verifies_their_checksums():
    store = make_store(8)
    grant = reserved(store, 1, 2, 3)
    data = b"".join(block_bytes(h) for h in (1, 2, 3))
    link = serve(StagedSink(store))
    link.chunk(grant.handle, 0, data[:BPB + 7])
    link.chunk(grant.handle, BPB + 7, data[BPB + 7:])
    assert link.end(grant.handle).bytes_received == 3 * BPB
    link.close()
    crcs = {0: wire_crc(data[:BPB + 7]), BPB + 7: wire_crc(data[BPB + 7:])}
    assert store.commit(grant.handle, crcs, 0.0) == 3
    assert read(store, 1, 2, 3) == [block_bytes(h) for h in (1, 2, 3)]

    grant = reserved(store, 4)
    link = serve(StagedSink(store))
    link.chunk(grant.handle, 0, block_bytes(4), crc=wire_crc(block_bytes(5)))
    assert link.reply().status == wire.STATUS_OF_ERROR[Aborted]
    link.close()
    assert store.stats().reserved_pages == 0 and store.lookup([4]).present == [False]


def test_a_chunk_spanning_many_segment_views_arrives_whole():
    """Bigger than PIECE and cut at odd offsets: several recvmsg_into groups."""
    from speckv.services.kvstore.dataplane.receiver import PIECE

    count = PIECE // BPB + 40
    store = make_store(count + 2)
    hashes = list(range(100, 100 + count))
    grant = store.reserve("o1", hashes, 30.0)
    data = b"".join(block_bytes(h) for h in hashes)
    link = serve(store)
    cut = PIECE + 333
    link.chunk(grant.handle, 0, data[:cut])
    link.chunk(grant.handle, cut, data[cut:])
    assert link.end(grant.handle).bytes_received == len(data)
    link.close()
    assert store.commit(grant.handle, {0: wire_crc(data[:cut]), cut: wire_crc(data[cut:])}, 0.0) == count
    assert read(store, *hashes) == [block_bytes(h) for h in hashes]

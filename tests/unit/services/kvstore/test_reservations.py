from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import (Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound,
                                          ResourceExhausted)
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.reservations import Intervals
from tests.support.kvstore_service import TINY, block_bytes, make_store, read, retained_events, writes

BPB = TINY.bytes_per_block


def payload(hashes):
    return b"".join(block_bytes(h) for h in hashes)


def send(store, grant, cuts=None):
    """Writes the granted blocks in chunks cut at `cuts`, last chunk first."""
    data = payload(grant.hashes)
    cuts = sorted({0, len(data), *(cuts or [])})
    crcs = {}
    for lo, hi in reversed(list(zip(cuts, cuts[1:]))):
        chunk = data[lo:hi]
        crcs[lo] = crc32c(chunk)
        store.write_chunk(grant.handle, lo, chunk, crcs[lo])
    return crcs


def setup(num_pages=8):
    clock = ManualClock(100.0)
    return make_store(num_pages=num_pages, clock=clock), clock


def test_reserve_skips_present_blocks_and_commit_publishes():
    store, _ = setup()
    store.put_blocks(writes(1))
    grant = store.reserve("o1", [1, 2, 3], lease_s=5.0, family="fam", parent=None)
    assert grant.hashes == (2, 3) and grant.bytes_per_block == BPB and grant.deadline_s == 105.0
    assert store.lookup([2]).present == [False]  # nothing visible before commit
    crcs = send(store, grant, cuts=[1, 100, BPB + 7])
    assert store.lookup([2, 3]).present == [False, False]
    assert store.commit(grant.handle, crcs, replica_lease_s=0) == 2
    assert read(store, 2, 3) == [block_bytes(2), block_bytes(3)]
    committed = retained_events(store)[-1]
    assert committed.type is EventType.COMMITTED and committed.block_hashes == (2, 3)
    assert committed.order_id == "o1" and committed.family == "fam"
    s = store.stats()
    assert (s.reserved_pages, s.blocks_committed_total, s.replica_pages) == (0, 2, 0)


def test_an_engine_save_publishes_stored_blocks_not_a_replica_landing():
    """The node's own engine writing what it computed (the vLLM connector's
    save through shared memory) is not a replication: followers of the events
    (the scheduler, the replica ledger) must not count it as one."""
    store, _ = setup()
    grant = store.reserve("vllm-save-1", [4, 5], lease_s=5.0, family="fam", parent=3, engine_save=True)
    assert store.commit(grant.handle, send(store, grant), replica_lease_s=0) == 2
    stored = retained_events(store)[-1]
    assert stored.type is EventType.STORED and stored.block_hashes == (4, 5)
    assert stored.order_id == "" and stored.parent == 3 and stored.family == "fam"
    assert store.stats().blocks_committed_total == 0
    assert read(store, 4, 5) == [block_bytes(4), block_bytes(5)]


def test_commit_is_idempotent():
    store, _ = setup()
    grant = store.reserve("o1", [2], lease_s=5.0)
    crcs = send(store, grant)
    assert store.commit(grant.handle, crcs, 0) == 1
    assert store.commit(grant.handle, crcs, 0) == 1
    with pytest.raises(FailedPrecondition, match="already committed"):
        store.write_chunk(grant.handle, 0, block_bytes(2), crc32c(block_bytes(2)))


def test_commit_before_every_byte_arrived_is_refused():
    store, _ = setup()
    grant = store.reserve("o1", [2, 3], lease_s=5.0)
    data = payload(grant.hashes)
    store.write_chunk(grant.handle, 0, data[:100], crc32c(data[:100]))
    with pytest.raises(FailedPrecondition, match=f"100..{2 * BPB}"):
        store.commit(grant.handle, {0: crc32c(data[:100])}, 0)
    assert store.lookup([2]).present == [False]
    assert store.stats().reserved_pages == 2  # still open: the writer may finish


def test_abort_frees_pages_and_publishes_nothing():
    store, _ = setup()
    before = store.stats().free_pages
    grant = store.reserve("o1", [2, 3], lease_s=5.0)
    send(store, grant)
    assert store.abort(grant.handle, "changed my mind") == 2
    assert store.stats().free_pages == before
    assert store.lookup([2, 3]).present == [False, False]
    assert store.abort(grant.handle) == 0
    with pytest.raises(Aborted, match="changed my mind"):
        store.write_chunk(grant.handle, 0, b"x", crc32c(b"x"))
    assert [e.type for e in retained_events(store)] == []


def test_unknown_handle_is_not_found():
    store, _ = setup()
    for call in (lambda: store.write_chunk("nope", 0, b"x", crc32c(b"x")),
                 lambda: store.commit("nope", {}, 0), lambda: store.abort("nope")):
        with pytest.raises(NotFound, match="nope"):
            call()
    with pytest.raises(InvalidArgument, match="handle is empty"):
        store.commit("", {}, 0)


def test_lapsed_reservation_is_reaped_and_refuses_chunks():
    store, clock = setup()
    grant = store.reserve("o1", [2], lease_s=5.0)
    clock.advance(4.0)
    store.write_chunk(grant.handle, 0, b"ab", crc32c(b"ab"))  # renews the lease to t=109
    clock.advance(4.0)
    assert store.maintenance() == 0
    clock.advance(1.0)
    assert store.maintenance() == 1
    assert store.stats().reserved_pages == 0 and store.stats().free_pages == 8
    with pytest.raises(Aborted, match="expired"):
        store.write_chunk(grant.handle, 2, b"cd", crc32c(b"cd"))


def test_expiry_is_noticed_without_maintenance():
    store, clock = setup()
    grant = store.reserve("o1", [2], lease_s=5.0)
    clock.advance(5.0)
    with pytest.raises(Aborted, match="expired"):
        store.write_chunk(grant.handle, 0, b"ab", crc32c(b"ab"))
    assert store.stats().free_pages == 8


def test_bad_chunk_checksum_aborts_and_frees():
    store, _ = setup()
    grant = store.reserve("o1", [2], lease_s=5.0)
    with pytest.raises(Aborted, match="crc32c"):
        store.write_chunk(grant.handle, 0, b"abc", crc32c(b"abd"))
    assert store.stats().free_pages == 8 and store.stats().reserved_pages == 0
    with pytest.raises(Aborted):
        store.commit(grant.handle, {}, 0)


@pytest.mark.parametrize("tamper", ["wrong", "missing", "extra"])
def test_commit_checksum_mismatch_publishes_nothing(tamper):
    store, _ = setup()
    grant = store.reserve("o1", [2, 3], lease_s=5.0)
    crcs = send(store, grant, cuts=[BPB])
    if tamper == "wrong":
        crcs[BPB] ^= 1
    elif tamper == "missing":
        del crcs[BPB]
    else:
        crcs[5] = 0
    with pytest.raises(Aborted, match="aborted, nothing published"):
        store.commit(grant.handle, crcs, 0)
    assert store.lookup([2, 3]).present == [False, False]
    assert store.stats().free_pages == 8


def test_chunks_outside_the_reservation_are_invalid():
    store, _ = setup()
    grant = store.reserve("o1", [2], lease_s=5.0)
    with pytest.raises(InvalidArgument, match="outside"):
        store.write_chunk(grant.handle, BPB - 1, b"ab", crc32c(b"ab"))
    with pytest.raises(InvalidArgument, match="empty"):
        store.write_chunk(grant.handle, 0, b"", crc32c(b""))


def test_reserve_validation():
    store, _ = setup()
    with pytest.raises(InvalidArgument, match="order_id is empty"):
        store.reserve("", [1], 5.0)
    with pytest.raises(InvalidArgument, match="no block hashes"):
        store.reserve("o", [], 5.0)
    with pytest.raises(InvalidArgument, match="repeated"):
        store.reserve("o", [1, 1], 5.0)
    with pytest.raises(InvalidArgument, match="lease_s"):
        store.reserve("o", [1], 0.0)


def test_reserve_evicts_but_not_pinned_or_reserved():
    store, _ = setup(num_pages=4)
    store.put_blocks(writes(1, 2, 3))
    store.pin([1, 2])
    first = store.reserve("o1", [10], lease_s=5.0)  # takes the free page
    second = store.reserve("o2", [11], lease_s=5.0)  # evicts 3
    assert store.lookup([3]).present == [False]
    with pytest.raises(ResourceExhausted, match="2 pinned, 2 reserved"):
        store.reserve("o3", [12], lease_s=5.0)
    assert {first.handle, second.handle} and read(store, 1, 2) == [block_bytes(1), block_bytes(2)]


def test_committed_replica_with_lapsed_lease_is_evicted_first():
    store, clock = setup(num_pages=3)
    store.put_blocks(writes(1))  # oldest ordinary block
    grant = store.reserve("o1", [2], lease_s=5.0)
    store.commit(grant.handle, send(store, grant), replica_lease_s=2.0)
    store.put_blocks(writes(3, family="g"))
    assert store.stats().replica_pages == 1
    clock.advance(3.0)
    store.put_blocks(writes(4, family="h"))
    assert store.lookup([1, 2, 3]).present == [True, False, True]


def test_used_replica_becomes_ordinary_block():
    store, clock = setup(num_pages=3)
    grant = store.reserve("o1", [2], lease_s=5.0)
    store.commit(grant.handle, send(store, grant), replica_lease_s=2.0)
    store.put_blocks(writes(1))
    assert store.lookup([2]).present == [True]  # a hit: the speculation paid off
    assert store.stats().replica_pages == 0
    store.put_blocks(writes(3, family="g"))
    clock.advance(3.0)
    store.put_blocks(writes(4, family="h"))  # plain LRU now: block 1 is the oldest
    assert store.lookup([1, 2]).present == [False, True]


def test_a_block_stored_meanwhile_keeps_its_copy():
    store, _ = setup()
    grant = store.reserve("o1", [2, 3], lease_s=5.0)
    crcs = send(store, grant)
    store.put_blocks(writes(2))
    assert store.commit(grant.handle, crcs, 0) == 1
    assert store.stats().free_pages == 8 - 2
    assert retained_events(store)[-1].block_hashes == (3,)


@pytest.mark.parametrize("ranges, covered, gaps", [
    ([], 0, [(0, 10)]),
    ([(0, 10)], 10, []),
    ([(5, 10), (0, 5)], 10, []),
    ([(0, 3), (6, 8), (2, 7)], 8, [(8, 10)]),
    ([(4, 6), (4, 6), (1, 2)], 3, [(0, 1), (2, 4), (6, 10)]),
])
def test_intervals(ranges, covered, gaps):
    intervals = Intervals()
    for lo, hi in ranges:
        intervals.add(lo, hi)
    assert intervals.covered() == covered and intervals.gaps(10) == gaps


@pytest.mark.parametrize("lo, hi", [(0, BPB), (BPB - 1, BPB + 1), (10, 20), (0, 2 * BPB)])
def test_bytes_once_written_cannot_be_written_again_and_the_refusal_changes_nothing(lo, hi):
    store, _ = setup()
    grant = store.reserve("o1", [1, 2], 30.0, family="f")
    data = payload([1, 2])
    first = {0: crc32c(data[:BPB])}
    store.write_chunk(grant.handle, 0, data[:BPB], first[0])
    forged = b"\xee" * (hi - lo)
    with pytest.raises(AlreadyExists, match="written once"):
        store.write_chunk(grant.handle, lo, forged, crc32c(forged))
    with pytest.raises(AlreadyExists):
        store.begin_write(grant.handle, lo, hi - lo)
    assert store.stats().reserved_pages == 2  # not aborted
    rest = {BPB: crc32c(data[BPB:])}
    store.write_chunk(grant.handle, BPB, data[BPB:], rest[BPB])  # the untouched range still takes its bytes
    assert store.commit(grant.handle, {**first, **rest}, 0.0) == 2
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]


def test_intervals_overlap_at_their_edges_only_when_a_byte_is_shared():
    spans = Intervals()
    spans.add(10, 20)
    spans.add(30, 40)
    assert [spans.overlaps(lo, hi) for lo, hi in [(0, 10), (20, 30), (19, 21), (9, 11), (25, 31), (40, 50)]] == \
        [False, False, True, True, True, False]

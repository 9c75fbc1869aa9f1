from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.records import BlockWrite
from tests.support.kvstore_service import block_bytes, make_store, read, retained_events, writes


def test_put_get_round_trip_is_byte_exact():
    store = make_store()
    result = store.put_blocks(writes(1, 2, 3))
    assert (result.stored, result.already_present, result.evicted) == (3, 0, 0)
    assert read(store, 3, 1) == [block_bytes(3), block_bytes(1)]
    again = store.put_blocks(writes(1, 4))
    assert (again.stored, again.already_present) == (1, 1)


def test_put_emits_one_stored_event_per_chain():
    store = make_store()
    store.put_blocks(writes(1, 2, 3) + writes(9, family="g"))
    stored = [(e.type, e.block_hashes, e.parent, e.family) for e in retained_events(store)]
    assert stored == [(EventType.STORED, (1, 2, 3), None, "f"), (EventType.STORED, (9,), None, "g")]


def test_lookup_reports_presence_and_prefix():
    store = make_store()
    store.put_blocks(writes(1, 2, 4))
    result = store.lookup([1, 2, 3, 4])
    assert result.present == [True, True, False, True] and result.prefix_blocks == 2


@pytest.mark.parametrize("call", ["lookup", "get_blocks", "pin", "unpin"])
def test_empty_hash_lists_are_invalid(call):
    with pytest.raises(InvalidArgument, match="no block hashes"):
        getattr(make_store(), call)([])


def test_put_validation_names_the_problem_and_changes_nothing():
    store = make_store()
    store.put_blocks(writes(1))
    with pytest.raises(InvalidArgument, match="no block hashes"):
        store.put_blocks([])
    with pytest.raises(InvalidArgument, match=r"hash 5\) has 3 bytes"):
        store.put_blocks(writes(4) + [BlockWrite(5, b"abc")])
    with pytest.raises(InvalidArgument, match="repeated block hashes: 2"):
        store.put_blocks(writes(2) + writes(2))
    with pytest.raises(InvalidArgument, match="at most 8"):
        store.put_blocks(writes(*range(10, 19)))
    with pytest.raises(InvalidArgument, match="uint64"):
        store.put_blocks([BlockWrite(-1, block_bytes(1))])
    assert store.lookup([1, 2, 4, 5]).present == [True, False, False, False]
    assert store.stats().last_event_sequence == 1


def test_unknown_hashes_are_not_found_by_name():
    store = make_store()
    store.put_blocks(writes(1))
    for call in (store.get_blocks, store.pin, store.unpin):
        with pytest.raises(NotFound, match="77, 78"):
            call([1, 77, 78])
    assert store.stats().pinned_pages == 0


def test_full_pool_evicts_lru_and_reports_removed():
    store = make_store(num_pages=3)
    store.put_blocks(writes(1))
    store.put_blocks(writes(2))
    store.put_blocks(writes(3))
    store.lookup([1])  # 1 becomes most recent
    result = store.put_blocks(writes(4))
    assert result.evicted == 1
    assert store.lookup([1, 2, 3, 4]).present == [True, False, True, True]
    removed = [e for e in retained_events(store) if e.type is EventType.REMOVED]
    assert [e.block_hashes for e in removed] == [(2,)]


@pytest.mark.parametrize("use", ["put", "lookup", "get_blocks", "pin"])
def test_a_chain_loses_its_tail_before_its_head(use):
    """A prefix is useless without its head: within one use of a chain the
    head must be evicted last, or the chain breaks while its tail stays."""
    store = make_store(num_pages=4)
    store.put_blocks(writes(1, 2, 3))
    store.put_blocks(writes(9))
    if use == "lookup":
        store.lookup([1, 2, 3])
    elif use == "get_blocks":
        for _ in store.get_blocks([1, 2, 3]):
            pass
    elif use == "pin":
        store.pin([1, 2, 3])
        store.unpin([1, 2, 3])
    else:
        store.put_blocks(writes(1, 2, 3))  # all resident: a re-put is a use
    store.put_blocks(writes(10, 11, 12))  # evicts three: 9, then the chain tail first
    assert store.lookup([1, 2, 3]).present == [True, False, False]
    assert store.lookup([1, 2, 3]).prefix_blocks == 1


def test_pool_full_of_pinned_blocks_is_exhausted_and_keeps_what_it_has():
    store = make_store(num_pages=3)
    store.put_blocks(writes(1, 2, 3))
    store.pin([1, 2])
    with pytest.raises(ResourceExhausted, match="2 pinned"):
        store.put_blocks(writes(4, 5))
    assert read(store, 1, 2, 3) == [block_bytes(1), block_bytes(2), block_bytes(3)]
    assert store.stats().blocks_evicted_total == 0
    assert store.put_blocks(writes(4)).evicted == 1  # only the unpinned block can go


def test_a_put_never_evicts_blocks_it_names():
    store = make_store(num_pages=3)
    store.put_blocks(writes(1, 2, 3))
    store.pin([3])
    with pytest.raises(ResourceExhausted, match="0 evictable"):
        store.put_blocks(writes(1, 2) + writes(4, family="g"))
    assert store.lookup([1, 2, 3]).prefix_blocks == 3


def test_pins_are_counted():
    store = make_store(num_pages=2)
    store.put_blocks(writes(1, 2))
    assert store.pin([1, 1]) == 2
    assert store.unpin([1]) == 1
    assert store.stats().pinned_pages == 1
    with pytest.raises(FailedPrecondition, match="not pinned"):
        store.unpin([1, 1])
    store.unpin([1])
    with pytest.raises(FailedPrecondition):
        store.unpin([2])


def test_reads_pin_until_the_stream_ends():
    store = make_store(num_pages=2)
    store.put_blocks(writes(1, 2))
    stream = store.get_blocks([1, 2])
    assert store.stats().pinned_pages == 2
    next(stream)
    stream.close()
    assert store.stats().pinned_pages == 0


def test_stats_count_pages_and_totals():
    clock = ManualClock(0.0)
    store = make_store(num_pages=4, clock=clock)
    store.put_blocks(writes(1, 2))
    store.pin([1])
    store.reserve("o1", [5], lease_s=10.0)
    s = store.stats()
    assert (s.num_pages, s.used_pages, s.free_pages, s.pinned_pages, s.reserved_pages) == (4, 3, 1, 1, 1)
    assert (s.evictable_pages, s.available_pages, s.blocks_stored_total) == (1, 2, 2)
    assert s.pool_bytes == 4 * s.geometry.bytes_per_block

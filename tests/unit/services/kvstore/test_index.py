from __future__ import annotations

import pytest

from speckv.services.common.ids import BlockHash
from speckv.services.kvstore.index import BlockEntry, BlockIndex


def add(index, h, lease=None):
    index.insert(BlockEntry(BlockHash(h), h, lease_deadline=lease))


def drain(index, now):
    order = []
    while (victim := index.pop_victim(now)) is not None:
        order.append(victim.block_hash)
    return order


def test_lru_order_and_touch():
    index = BlockIndex()
    for h in (1, 2, 3):
        add(index, h)
    index.touch(1)
    assert drain(index, now=0.0) == [2, 3, 1]


def test_expired_replica_goes_before_older_lru_block():
    index = BlockIndex()
    add(index, 1)  # oldest ordinary block
    add(index, 2, lease=10.0)  # replica, lease until t=10
    add(index, 3)
    assert drain_copy(index, now=5.0) == [1, 2, 3]  # lease running: plain LRU
    assert drain(index, now=10.0) == [2, 1, 3]


def drain_copy(index, now):
    """Eviction order without changing index: rebuild a twin."""
    twin = BlockIndex()
    for h in index.eviction_order():  # LRU order
        entry = index.get(h)
        twin.insert(BlockEntry(entry.block_hash, entry.page, lease_deadline=entry.lease_deadline))
    return drain(twin, now)


def test_replicas_expire_earliest_deadline_first():
    index = BlockIndex()
    add(index, 1, lease=3.0)
    add(index, 2, lease=1.0)
    add(index, 3)
    assert drain(index, now=5.0) == [2, 1, 3]


def test_touched_replica_becomes_ordinary():
    index = BlockIndex()
    add(index, 1)
    add(index, 2, lease=1.0)
    assert index.replica_count == 1
    index.touch(2)
    assert index.replica_count == 0 and index.get(2).lease_deadline is None
    assert drain(index, now=5.0) == [1, 2]


def test_pinned_blocks_are_never_evicted():
    index = BlockIndex()
    add(index, 1, lease=1.0)
    add(index, 2)
    index.pin(1)
    index.pin(2)
    index.pin(2)
    assert index.pop_victim(now=9.0) is None
    assert index.pinned_count == 2 and index.evictable_count == 0
    index.unpin(2)
    assert index.pop_victim(now=9.0) is None  # still pinned once
    index.unpin(1)  # an expired replica again goes first once unpinned
    index.unpin(2)
    assert drain(index, now=9.0) == [1, 2]


def test_longest_prefix():
    index = BlockIndex()
    for h in (10, 11, 13):
        add(index, h)
    assert index.longest_prefix([10, 11, 12, 13]) == 2
    assert index.longest_prefix([12, 10]) == 0
    assert index.longest_prefix([]) == 0


def test_lease_heap_stays_bounded_when_replicas_are_touched():
    index = BlockIndex()
    for h in range(1000):
        add(index, h, lease=100.0)
        index.touch(h)
    assert len(index._eviction._leases) <= 2 * index.replica_count + 65


@pytest.mark.parametrize("count", [0, 1, 5])
def test_remove_keeps_counters(count):
    index = BlockIndex()
    for h in range(count):
        add(index, h, lease=1.0)
    for h in range(count):
        index.remove(h)
    assert len(index) == 0 and index.replica_count == 0 and index.evictable_count == 0

"""The eviction strategy (eviction.py): lapsed replicas first, then LRU;
pins, protect and retention respected; and the index asks its strategy."""
from __future__ import annotations

from speckv.services.common.ids import BlockHash
from speckv.services.common.retention import Retention
from speckv.services.kvstore.eviction import Eviction, LapsedThenLRU
from speckv.services.kvstore.index import BlockEntry, BlockIndex


def make(*blocks: tuple[int, float | None]) -> tuple[dict[BlockHash, BlockEntry], LapsedThenLRU]:
    """A strategy over entries added in the order given (the last most recent)."""
    entries: dict[BlockHash, BlockEntry] = {}
    strategy = LapsedThenLRU(entries)
    replicas = 0
    for h, lease in blocks:
        entries[BlockHash(h)] = entry = BlockEntry(BlockHash(h), h, lease_deadline=lease)
        replicas += lease is not None
        strategy.added(entry, replicas)
    return entries, strategy


def drain(entries, strategy, now, protect=frozenset(), retention=None) -> list[int]:
    order = []
    while (h := strategy.victim(now, protect, retention)) is not None:
        order.append(h)
        strategy.dropped(h)
        del entries[h]
    return order


def test_least_recently_used_first_and_a_use_moves_a_block_to_the_recent_end():
    entries, strategy = make((1, None), (2, None), (3, None))
    strategy.used(BlockHash(1))
    assert list(strategy.order()) == [2, 3, 1] and len(strategy) == 3
    assert drain(entries, strategy, now=0.0) == [2, 3, 1]


def test_lapsed_replicas_go_first_earliest_deadline_first_then_lru():
    entries, strategy = make((1, None), (2, 9.0), (3, 4.0), (4, None), (5, 20.0))
    # At 10 the leases of 3 and 2 have lapsed (deadline order); 5's still runs: it goes by LRU.
    assert drain(entries, strategy, now=10.0) == [3, 2, 1, 4, 5]


def test_a_lease_running_protects_nothing_from_lru():
    entries, strategy = make((1, 50.0), (2, None))
    assert drain(entries, strategy, now=0.0) == [1, 2]


def test_a_used_replica_lapses_no_more():
    entries, strategy = make((1, None), (2, 1.0))
    entries[BlockHash(2)].lease_deadline = None  # the index clears the lease on a use
    strategy.used(BlockHash(2))
    assert drain(entries, strategy, now=5.0) == [1, 2]


def test_pinned_blocks_are_never_victims_and_come_back_most_recent():
    entries, strategy = make((1, 1.0), (2, None), (3, None))
    entries[BlockHash(1)].pins = 1
    strategy.held(BlockHash(1))
    assert strategy.victim(5.0, frozenset(), None) == 2  # 1's lease lapsed, but it is pinned
    entries[BlockHash(1)].pins = 0
    strategy.released(entries[BlockHash(1)], 1)
    assert list(strategy.order()) == [2, 3, 1]
    assert strategy.victim(5.0, frozenset(), None) == 1  # unpinned, its lapsed lease counts again


def test_protected_blocks_are_passed_over_where_they_stand():
    entries, strategy = make((1, 1.0), (2, None), (3, None))
    assert strategy.victim(5.0, {BlockHash(1), BlockHash(2)}, None) == 3
    assert list(strategy.order()) == [1, 2, 3]
    assert strategy.victim(5.0, {BlockHash(1), BlockHash(2), BlockHash(3)}, None) is None
    assert strategy.victim(5.0, frozenset(), None) == 1  # the passed-over lease was kept


def test_retained_blocks_get_a_second_chance_unless_all_are_retained():
    # Retention is the last tier's: a retained block at the LRU head goes to the recent end.
    entries, strategy = make((1, None), (2, 1.0), (3, None), (4, None))
    retention = Retention(8)
    retention.retain([1, 2], until=100.0, now=0.0)
    assert strategy.victim(5.0, frozenset(), retention) == 3
    assert list(strategy.order()) == [3, 4, 1, 2]
    entries, strategy = make((1, None), (2, None))
    retention = Retention(8)
    retention.retain([1, 2], until=100.0, now=0.0)
    assert strategy.victim(5.0, frozenset(), retention) == 1


def test_the_lease_heap_stays_bounded_by_the_live_leases():
    index = BlockIndex()
    for h in range(1000):
        index.insert(BlockEntry(BlockHash(h), h, lease_deadline=float(h)))
        index.touch(BlockHash(h))
    assert len(index._eviction._leases) <= 2 * index.replica_count + 65


class _MostRecentFirst(Eviction):
    """A toy strategy: evicts the most recently added unpinned block."""

    def __init__(self, entries) -> None:
        self._order: list[BlockHash] = []

    def added(self, entry, replicas):
        self._order.append(entry.block_hash)

    def used(self, block_hash):
        pass

    def held(self, block_hash):
        self._order.remove(block_hash)

    def released(self, entry, replicas):
        self._order.append(entry.block_hash)

    def dropped(self, block_hash):
        self._order.remove(block_hash)

    def victim(self, now, protect, retention):
        return next((h for h in reversed(self._order) if h not in protect), None)

    def __len__(self):
        return len(self._order)

    def order(self):
        return iter(self._order)


def test_the_index_evicts_by_the_strategy_it_is_given():
    index = BlockIndex(_MostRecentFirst)
    for h in (1, 2, 3):
        index.insert(BlockEntry(BlockHash(h), h))
    index.pin(BlockHash(3))
    assert index.evictable_count == 2
    assert [index.pop_victim(0.0).block_hash, index.pop_victim(0.0).block_hash] == [2, 1]
    assert index.pop_victim(0.0) is None and len(index) == 1

"""The retain action in the live store: a retained prefix stays on the node
(demoted, not dropped) until its deadline; at most retain_max_share of the
last tier is retained; bad requests get clear errors and change nothing."""
from __future__ import annotations

import math

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.tiers import Tier
from tests.support.kvstore_service import block_bytes, make_store, read, writes


def store_with(device=2, host=4, share=0.5):
    clock = ManualClock(100.0)
    return make_store(num_pages=device, host_pages=host, clock=clock, retain_max_share=share), clock


@pytest.mark.parametrize("host", [4, 0])
def test_a_retained_chain_outlives_lru_pressure_until_its_deadline(host):
    store, clock = store_with(device=4, host=host)
    store.put_blocks(writes(1, 2))
    assert store.retain([1, 2], ttl_s=30.0) == 2
    for first in range(10, 40, 2):  # far more than the node holds, all used after 1, 2
        store.put_blocks(writes(first, first + 1))
    assert store.lookup([1, 2]).prefix_blocks == 2
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]
    last_tier = Tier.HOST if host else Tier.DEVICE
    assert store.tier_of(1) is last_tier  # demoted below when there is a tier below, never dropped
    clock.advance(30.0)
    for first in range(50, 80, 2):
        store.put_blocks(writes(first, first + 1))
    assert store.lookup([1, 2]).prefix_blocks == 0  # lapsed: LRU again
    assert store.stats().retained_blocks == 0  # what left the node holds no slot


def test_at_most_the_configured_share_of_the_last_tier_is_retained():
    store, clock = store_with(device=2, host=4, share=0.5)  # 2 of 4 host pages
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3, 4))
    assert store.retain([1, 2], 60.0) == 2
    assert store.retain([3, 4], 60.0) == 0
    assert (store.stats().retained_blocks, store.stats().retain_max_blocks) == (2, 2)
    clock.advance(60.0)
    assert store.stats().retained_blocks == 0  # a lapsed retain is not counted, though nothing retained since


def test_only_the_prefix_the_node_holds_is_retained():
    store, _ = store_with(device=4, host=4)
    store.put_blocks(writes(1, 2))
    assert store.retain([1, 2, 3], 10.0) == 2
    assert store.retain([9, 1], 10.0) == 0


def test_retention_is_no_use_and_moves_nothing():
    store, _ = store_with(device=2, host=4)
    store.put_blocks(writes(1, 2))
    before = store.stats()
    store.retain([1, 2], 10.0)
    after = store.stats()
    assert (after.blocks_stored_total, after.blocks_demoted_total, after.blocks_promoted_total) == (
        before.blocks_stored_total, before.blocks_demoted_total, before.blocks_promoted_total)
    assert after.last_event_sequence == before.last_event_sequence  # nothing for the index to learn


def test_a_write_still_finds_room_when_every_evictable_block_is_retained():
    store, _ = store_with(device=2, host=0, share=0.99)  # 1 of 2 device pages may be retained
    store.put_blocks(writes(1))
    store.retain([1], 60.0)
    store.put_blocks(writes(5, 6))  # needs both pages: the retained block goes (a preference, not a pin)
    assert store.lookup([5, 6]).prefix_blocks == 2 and store.tier_of(1) is None
    assert store.stats().retained_blocks == 0


@pytest.mark.parametrize("ttl_s", [0.0, -1.0, math.nan, math.inf])
def test_a_bad_ttl_is_invalid_and_retains_nothing(ttl_s):
    store, _ = store_with()
    store.put_blocks(writes(1))
    with pytest.raises(InvalidArgument):
        store.retain([1], ttl_s)
    assert store.stats().retained_blocks == 0


@pytest.mark.parametrize("share", [-0.1, 1.0, 2.0])
def test_a_share_outside_0_1_is_refused(share):
    with pytest.raises(InvalidArgument):
        store_with(share=share)

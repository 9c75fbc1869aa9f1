"""The kvstore's gauges read from StoreStats: pages per tier and state,
occupancy per tier, block totals, each point naming the node."""
from __future__ import annotations

from speckv.services.kvstore.server import block_totals, tier_occupancy, tier_pages
from tests.support.kvstore_service import make_store, writes


def _by(points, *keys):
    return {tuple(attrs[k] for k in keys): v for v, attrs in points}


def test_pages_per_tier_and_state_follow_the_store():
    store = make_store(num_pages=8, host_pages=4, node_id="n7")
    store.put_blocks(writes(1, 2, 3))
    pages = _by(tier_pages(store.stats()), "tier", "state")
    assert {a["node"] for _, a in tier_pages(store.stats())} == {"n7"}
    assert (pages[("device", "used")], pages[("device", "free")]) == (3, 5)
    assert (pages[("host", "used")], pages[("host", "free")]) == (0, 4)
    assert {state for _, state in pages} == {"used", "free", "pinned", "reserved", "replica", "evictable"}
    assert _by(tier_occupancy(store.stats()), "tier") == {("device",): 3 / 8, ("host",): 0.0}


def test_a_node_without_a_host_tier_reports_the_device_tier_only():
    store = make_store(num_pages=8)
    assert {a["tier"] for _, a in tier_pages(store.stats())} == {"device"}
    assert [a["tier"] for _, a in tier_occupancy(store.stats())] == ["device"]


def test_block_totals_count_what_left_the_device_tier():
    store = make_store(num_pages=2, host_pages=4)
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3))  # the device tier is full: one block is demoted to the host tier
    totals = _by(block_totals(store.stats()), "kind")
    assert totals[("stored",)] == 3
    assert totals[("evicted",)] == totals[("demoted",)] == 1
    assert totals[("dropped",)] == 0

"""A kvstore with a host tier: evicted blocks are demoted, not lost; host
hits are promoted byte-exact before use; both tiers evict a chain tail
first; pins and leases hold in both; a replica to the host tier evicts
nothing from the device tier; every event names its tier."""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.events import EventType
from tests.support.kvstore_service import block_bytes, make_store, read, retained_events, writes


def tiered(device=2, host=4, clock=None):
    return make_store(num_pages=device, host_pages=host, clock=clock or ManualClock(100.0))


def events(store, after=0):
    return [(e.type, e.block_hashes, e.medium) for e in retained_events(store) if e.sequence > after]


def replicate(store, hashes, tier, lease_s=0.0):
    """A whole replication handshake into store's tier (as a target)."""
    grant = store.reserve("o1", hashes, 10.0, family="r", tier=tier)
    data = b"".join(block_bytes(h) for h in grant.hashes)
    store.write_chunk(grant.handle, 0, data, crc32c(data))
    return store.commit(grant.handle, {0: crc32c(data)}, lease_s)


def test_a_block_the_device_tier_evicts_is_demoted_with_its_bytes():
    store = tiered()
    store.put_blocks(writes(1, 2))
    last = store.stats().last_event_sequence
    store.put_blocks(writes(3, 4))
    assert store.tier_of(1) is Tier.HOST and store.tier_of(3) is Tier.DEVICE
    assert store.lookup([1, 2, 3, 4]).prefix_blocks == 4
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]
    # The host copy is announced before the device copy goes: the node never seems to lose it.
    assert events(store, last) == [(EventType.STORED, (1, 2), "CPU"), (EventType.REMOVED, (2, 1), "GPU"),
                                   (EventType.STORED, (3, 4), "GPU")]
    s = store.stats()
    assert (s.blocks_demoted_total, s.blocks_dropped_total, s.host.used_pages, s.used_pages) == (2, 0, 2, 2)


def test_without_a_host_tier_an_eviction_is_a_drop():
    store = make_store(num_pages=2)
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3))
    assert store.lookup([1, 2]).present == [True, False]
    assert store.stats().blocks_dropped_total == 1 and store.stats().host is None


def test_promotion_copies_host_hits_up_byte_exact_and_keeps_the_host_copy():
    store = tiered(device=3, host=6)
    store.put_blocks(writes(1, 2, 3))
    store.put_blocks(writes(4, 5, 6))  # 3, 2, 1 demoted
    last = store.stats().last_event_sequence
    assert store.promote([1, 2, 4]) == 2  # 4 is on the device already; 6 and 5 make room (demoted)
    assert store.tier_of(1) is Tier.DEVICE and store.tier_of(2) is Tier.DEVICE and store.tier_of(4) is Tier.DEVICE
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]
    assert events(store, last) == [(EventType.STORED, (5, 6), "CPU"), (EventType.REMOVED, (6, 5), "GPU"),
                                   (EventType.STORED, (1, 2), "GPU")]
    demoted = store.stats().blocks_demoted_total
    store.put_blocks(writes(7, 8, 9))  # 4, 2, 1 leave the device: only 4 has no host copy yet
    assert store.stats().blocks_demoted_total == demoted + 1
    assert store.lookup([1, 2, 4]).prefix_blocks == 3 and store.stats().blocks_promoted_total == 2


def test_promotion_needs_every_block_resident_and_is_a_no_op_without_host_hits():
    store = tiered()
    store.put_blocks(writes(1))
    with pytest.raises(NotFound, match="9"):
        store.promote([1, 9])
    assert store.promote([1]) == 0
    plain = make_store()
    plain.put_blocks(writes(1))
    assert plain.promote([1]) == 0


def test_the_host_tier_evicts_a_chain_tail_first():
    store = tiered(device=3, host=3)
    store.put_blocks(writes(1, 2, 3))
    store.put_blocks(writes(7, 8, 9))  # 3, 2, 1 demoted: 1 most recent in the host tier
    store.put_blocks(writes(10, 11))  # 9, 8 demoted: the host tier drops 3, then 2
    assert store.lookup([1, 2, 3]).present == [True, False, False]
    assert store.stats().blocks_dropped_total == 2


def test_a_pinned_block_stays_in_whichever_tier_holds_it():
    store = tiered(device=2, host=2)
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3, 4))  # 1, 2 demoted
    store.pin([1])
    store.put_blocks(writes(5, 6))  # 3, 4 demoted: the host tier must drop 2, never pinned 1
    assert store.tier_of(1) is Tier.HOST and store.tier_of(2) is None
    with pytest.raises(FailedPrecondition, match="not pinned"):
        store.unpin([1, 1])
    assert store.unpin([1]) == 1 and store.stats().host.pinned_pages == 0


def test_a_lapsed_replica_is_dropped_not_demoted():
    clock = ManualClock(100.0)
    store = tiered(device=2, host=4, clock=clock)
    replicate(store, [5], Tier.DEVICE, lease_s=1.0)
    store.put_blocks(writes(6))
    clock.advance(2.0)
    store.put_blocks(writes(7))  # the lapsed replica goes first, and not down
    assert store.tier_of(5) is None and store.stats().blocks_demoted_total == 0


def test_a_replica_to_the_host_tier_evicts_nothing_from_the_device_tier():
    store = tiered(device=2, host=2)
    store.put_blocks(writes(1, 2))
    before = store.stats()
    assert replicate(store, [5, 6], Tier.HOST, lease_s=5.0) == 2
    after = store.stats()
    assert store.tier_of(5) is Tier.HOST and store.lookup([1, 2]).prefix_blocks == 2
    assert (after.used_pages, after.blocks_evicted_total) == (before.used_pages, before.blocks_evicted_total)
    assert after.host.replica_pages == 2
    assert events(store)[-1] == (EventType.COMMITTED, (5, 6), "CPU")
    assert read(store, 5) == [block_bytes(5)]


def test_a_reserved_host_page_is_invisible_until_commit():
    store = tiered()
    grant = store.reserve("o1", [5], 10.0, tier=Tier.HOST)
    assert store.lookup([5]).present == [False]
    store.abort(grant.handle)
    assert store.stats().host.used_pages == 0


def test_a_reservation_skips_what_either_tier_holds():
    store = tiered()
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3, 4))  # 1, 2 in the host tier
    grant = store.reserve("o1", [1, 2, 5], 10.0, tier=Tier.DEVICE)
    assert grant.hashes == (5,)


def test_an_order_naming_a_tier_the_node_lacks_is_refused():
    with pytest.raises(FailedPrecondition, match="no host tier"):
        make_store().reserve("o1", [5], 10.0, tier=Tier.HOST)
    with pytest.raises(InvalidArgument, match="host_pages"):
        make_store(host_pages=-1)


def test_a_snapshot_lists_each_tier():
    store = tiered()
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3, 4))
    snapshot = next(store.subscribe(0))
    assert snapshot.type is EventType.SNAPSHOT
    assert sorted(snapshot.block_hashes) == [3, 4] and sorted(snapshot.host_block_hashes) == [1, 2]


def test_a_replication_source_reads_blocks_from_either_tier():
    store = tiered()
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3))  # 2 demoted (tail first), 1 still on the device
    out = bytearray(3 * store.bytes_per_block)
    with store.hold([1, 2, 3]):
        store.pack([1, 2, 3], out)
        assert store.pages_of([1, 2, 3]) is None  # no single tier holds all: no zero-copy views
    assert bytes(out) == block_bytes(1) + block_bytes(2) + block_bytes(3)

"""The store's shared-memory side: pools in arenas a peer maps, reads of
pinned pages, writes into reserved pages checked at commit."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.shm.backend import SharedMemoryBackend
from speckv.services.kvstore.shm.mapped_pool import MappedPools, SharedPoolInfo
from speckv.services.kvstore.store import KVStoreCore
from tests.support.kvstore_service import TINY, block_bytes, make_store, read, writes


def shared_store(num_pages=8, host_pages=0, clock=None):
    return KVStoreCore("n1", TINY, num_pages, clock or ManualClock(1000.0), backend=SharedMemoryBackend("n1"),
                       host_pages=host_pages,
                       host_backend=SharedMemoryBackend("n1-host") if host_pages else None)


def mapped(store):
    """The store's pools mapped a second time, as a same-host peer maps them."""
    infos = [SharedPoolInfo(tier.medium, a, a.size // TINY.bytes_per_block) for tier, a in store.shared_arenas().items()]
    return MappedPools(infos, TINY)


def canonical(pools, medium, page):
    """A block's canonical bytes read from a mapping: its segments in (layer, K/V) order."""
    pool = pools.pool(medium)
    return b"".join(pool[layer, kv, page].tobytes() for layer in range(TINY.num_layers) for kv in range(2))


def test_private_pools_share_nothing():
    assert make_store().shared_arenas() == {}
    with pytest.raises(FailedPrecondition, match="private memory"):
        store = make_store()
        store.put_blocks(writes(1))
        store.map_blocks([1], 5.0)


def test_map_blocks_names_pages_holding_the_bytes_and_pins_them():
    store = shared_store()
    store.put_blocks(writes(1, 2, 3))
    pools = mapped(store)
    places = store.map_blocks([1, 2, 3], 5.0)
    assert [p.tier for p in places] == [Tier.DEVICE] * 3
    assert [canonical(pools, "GPU", p.page) for p in places] == [block_bytes(h) for h in (1, 2, 3)]
    assert store.stats().pinned_pages == 3
    store.unpin([1, 2, 3])
    assert store.stats().pinned_pages == 0


def test_map_blocks_lease_lapses_and_missing_blocks_pin_nothing():
    clock = ManualClock(1000.0)
    store = shared_store(clock=clock)
    store.put_blocks(writes(1, 2))
    with pytest.raises(NotFound):
        store.map_blocks([1, 9], 5.0)
    assert store.stats().pinned_pages == 0
    store.map_blocks([1, 2], 5.0)
    clock.advance(5.0)
    store.maintenance()
    assert store.stats().pinned_pages == 0
    with pytest.raises(InvalidArgument):
        store.map_blocks([1], 0.0)


def test_host_only_blocks_are_read_from_the_host_pool():
    store = shared_store(num_pages=2, host_pages=4)
    store.put_blocks(writes(1, 2))
    store.put_blocks(writes(3, 4))  # demotes 1, 2 to the host tier
    pools = mapped(store)
    places = store.map_blocks([1, 2], 5.0)
    assert {p.tier for p in places} == {Tier.HOST}
    assert [canonical(pools, "CPU", p.page) for p in places] == [block_bytes(1), block_bytes(2)]


def write_shared(store, pools, hashes, tamper=False):
    grant = store.reserve("o1", hashes, 10.0, family="f")
    tier, pages = store.reservation_pages(grant.handle)
    pool = pools.pool(tier.medium)
    g = TINY
    for h, page in zip(grant.hashes, pages):
        block = np.frombuffer(block_bytes(h), dtype=g.storage_dtype).reshape(g.num_layers, 2, g.block_size,
                                                                             g.num_kv_heads, g.head_dim)
        pool[:, :, page] = block
    crcs = pools.blocks_crcs(tier.medium, pages)
    if tamper:
        pool[0, 0, pages[-1]].reshape(-1)[0] += 1  # a byte changes after the writer checksummed it
    return grant, crcs


@pytest.mark.parametrize("n", [1, 3, 4, 5])  # 0 blocks to write: test_present_blocks_are_not_reserved_again
def test_blocks_written_through_shared_memory_are_visible_only_after_commit(n):
    store = shared_store(num_pages=8)
    pools = mapped(store)
    hashes = list(range(10, 10 + n))
    grant, crcs = write_shared(store, pools, hashes)
    assert store.lookup(hashes).prefix_blocks == 0
    assert store.commit_shared(grant.handle, crcs, 0.0) == n
    assert read(store, *hashes) == [block_bytes(h) for h in hashes]
    assert store.stats().reserved_pages == 0


def test_present_blocks_are_not_reserved_again():
    store = shared_store()
    store.put_blocks(writes(1))
    pools = mapped(store)
    grant, crcs = write_shared(store, pools, [1, 2])
    assert grant.hashes == (2,) and list(crcs) == [0]
    assert store.commit_shared(grant.handle, crcs, 0.0) == 1
    assert read(store, 1, 2) == [block_bytes(1), block_bytes(2)]
    grant, crcs = write_shared(store, pools, [1, 2])  # nothing left to write: an empty reservation
    assert grant.hashes == () and crcs == {}
    assert store.commit_shared(grant.handle, crcs, 0.0) == 0


def test_bytes_that_do_not_match_their_checksum_are_aborted_and_freed():
    store = shared_store()
    pools = mapped(store)
    grant, crcs = write_shared(store, pools, [1, 2], tamper=True)
    with pytest.raises(Aborted, match="crc32c"):
        store.commit_shared(grant.handle, crcs, 0.0)
    assert store.lookup([1, 2]).prefix_blocks == 0 and store.stats().used_pages == 0


@pytest.mark.parametrize("cut", ["start", "outside", "none"])
def test_chunks_that_do_not_cover_the_reservation_are_refused(cut):
    store = shared_store()
    pools = mapped(store)
    grant, crcs = write_shared(store, pools, [1, 2])
    bad = {"start": {TINY.bytes_per_block: 0}, "outside": {0: crcs[0], 2 * TINY.bytes_per_block: 1},
           "none": {}}[cut]
    with pytest.raises(InvalidArgument):
        store.commit_shared(grant.handle, bad, 0.0)
    assert store.commit_shared(grant.handle, crcs, 0.0) == 2  # nothing lost: the right commit still works


def test_a_private_tier_has_no_pages_to_hand_out():
    store = make_store()
    grant = store.reserve("o1", [1], 10.0)
    with pytest.raises(FailedPrecondition, match="not shared"):
        store.reservation_pages(grant.handle)


def test_map_blocks_in_prefix_mode_pins_the_longest_resident_prefix():
    store = shared_store()
    store.put_blocks(writes(1, 2, 3))
    assert [p.page for p in store.map_blocks([1, 2, 9, 3], 5.0, prefix=True)] == \
        [p.page for p in store.map_blocks([1, 2], 5.0)]
    assert store.stats().pinned_pages == 2
    assert store.map_blocks([9, 1], 5.0, prefix=True) == []
    assert store.stats().pinned_pages == 2

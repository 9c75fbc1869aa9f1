"""The simulated kvstore evicts as the live one does: a chain's tail before its head,
lapsed replicas first, and the same victims as the live BlockIndex under random use."""
from __future__ import annotations

import random

import pytest

from speckv.loadgen.sim.kvnode import SimKVNode
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.index import BlockEntry, BlockIndex
from speckv.services.scheduler.holder_index import HolderEventKind, HolderIndex, IndexEvent


@pytest.mark.parametrize("reuse", ["lookup", "put"])
def test_a_chain_loses_its_tail_before_its_head(reuse):
    node = SimKVNode("n", pages=4)
    node.put([1, 2, 3], now=0.0)
    node.put([9], now=1.0)
    if reuse == "lookup":
        assert node.lookup([1, 2, 3]) == 3
    else:
        assert node.put([1, 2, 3], now=2.0).stored == []
    out = node.put([10, 11, 12], now=3.0)
    assert out.evicted == [9, 3, 2]
    assert node.lookup([1, 2, 3]) == 1


def test_a_replica_goes_in_tail_first_and_reports_its_blocks_head_first():
    node = SimKVNode("n", pages=3)
    out = node.put([5, 6, 7], now=0.0, lease_deadline=10.0)
    assert out.stored == [5, 6, 7]
    lapsed = node.put([8], now=11.0)  # lapsed replicas go first, earliest deadline, then tail first
    assert lapsed.evicted == [7]


def test_a_put_never_evicts_resident_blocks_of_its_own_chain():
    node = SimKVNode("n", pages=3)
    node.put([1, 2], now=0.0)
    node.put([7], now=1.0)  # now 1, 2 are the least recently used
    out = node.put([1, 2, 3], now=2.0)  # 3 needs a page: 7 goes, not 1 or 2
    assert out.evicted == [7] and node.lookup([1, 2, 3]) == 3


def test_a_chain_longer_than_the_pool_keeps_what_fits():
    node = SimKVNode("n", pages=2)
    out = node.put([1, 2, 3], now=0.0)
    assert out.stored == [1, 2, 3] and out.evicted == [1]
    assert len(node) == 2


class _LiveIndexNode:
    """The reference: the same operations on the live kvstore's BlockIndex, with pages."""

    def __init__(self, pages: int) -> None:
        self.index, self.free = BlockIndex(), list(range(pages - 1, -1, -1))

    def lookup(self, hashes):
        n = self.index.longest_prefix(hashes)
        self.index.touch_chain(hashes[:n])
        return n

    def put(self, hashes, now, lease_deadline=None):
        stored, evicted = [], []
        order = list(hashes)
        if lease_deadline is not None:
            order.reverse()
        else:
            self.index.touch_chain([h for h in hashes if h in self.index])
        for h in order:
            if h in self.index:
                continue
            if self.free:
                page = self.free.pop()
            else:
                victim = self.index.pop_victim(now)
                page = victim.page
                evicted.append(victim.block_hash)
            self.index.insert(BlockEntry(h, page, lease_deadline=lease_deadline))
            stored.append(h)
        if lease_deadline is not None:
            stored.reverse()
        else:
            self.index.touch_chain([h for h in hashes if h in self.index])
        return stored, evicted


@pytest.mark.parametrize("pages,span", [(1, 40), (2, 40), (7, 40), (8, 40), (9, 40), (64, 40), (200, 300)])
@pytest.mark.parametrize("seed", range(3))
def test_random_puts_and_lookups_store_and_evict_as_the_live_index(pages, span, seed):
    """span: the hashes in play; (200, 300) keeps hundreds of replicas with
    equal deadlines resident, so the lease heap is rebuilt and its ties matter."""
    rng = random.Random(seed)
    node, live = SimKVNode("n", pages), _LiveIndexNode(pages)
    now = 0.0
    for _ in range(3_000):
        start = rng.randrange(span)
        chain = list(range(start, start + rng.randrange(0, 12)))
        action = rng.random()
        if action < 0.3:
            assert node.lookup(chain) == live.lookup(chain)
        elif action < 0.5:  # replicas, some with deadlines already in the past, many with equal deadlines
            deadline = now + rng.choice([-1.0, 0.0, 2.0, 5.0])
            out = node.put(chain, now, lease_deadline=deadline)
            assert (out.stored, out.evicted) == live.put(chain, now, lease_deadline=deadline)
        else:
            out = node.put(chain, now)
            assert (out.stored, out.evicted) == live.put(chain, now)
        assert len(node) == len(live.index) <= pages
        now += rng.choice([0.0, 0.5, 1.0])


def test_lapsed_replicas_with_one_deadline_go_in_the_live_order_after_the_lease_heap_is_rebuilt():
    node, live = SimKVNode("n", 300), _LiveIndexNode(300)
    for h in range(100):
        assert node.put([h], 0.0, lease_deadline=10.0).stored == live.put([h], 0.0, lease_deadline=10.0)[0]
    unused = list(range(0, 100, 20)) + list(range(1, 100, 20))
    for h in range(100):  # a use clears the lease: 90 stale heap entries, which the next push rebuilds away
        if h not in unused:
            assert node.lookup([h]) == live.lookup([h]) == 1
    for h in range(500, 505):
        assert node.put([h], 1.0, lease_deadline=10.0).stored == live.put([h], 1.0, lease_deadline=10.0)[0]
    fill = list(range(1000, 1200))
    out = node.put(fill, 11.0)
    assert (out.stored, out.evicted) == live.put(fill, 11.0)
    assert out.evicted[:3] == [0, 1, 20]  # lapsed replicas first, in the order they were stored


# --- tiers -------------------------------------------------------------------------

def test_a_block_evicted_from_the_device_tier_is_demoted_not_lost():
    node = SimKVNode("n", pages=2, host_pages=4)
    node.put([1, 2], now=0.0)
    out = node.put([3, 4], now=1.0)
    assert out.evicted == [2, 1] and out.demoted == [2, 1] and out.dropped == []
    assert node.in_tier(1, Tier.HOST) and not node.in_tier(1, Tier.DEVICE)
    assert node.lookup([1, 2]) == 2 and node.host_only([1, 2], 2) == 2


def test_without_a_host_tier_evictions_are_drops():
    node = SimKVNode("n", pages=2)
    node.put([1, 2], now=0.0)
    out = node.put([3], now=1.0)
    assert out.evicted == out.dropped == [2] and out.demoted == []


def test_promotion_copies_host_hits_into_the_device_tier_and_keeps_the_host_copy():
    node = SimKVNode("n", pages=2, host_pages=4)
    node.put([1, 2], now=0.0)
    node.put([3, 4], now=1.0)  # 1, 2 demoted
    out = node.put([1, 2], now=2.0)  # the promotion
    assert out.stored == [1, 2] and out.evicted == [4, 3] and out.demoted == [4, 3]
    assert all(node.in_tier(h, Tier.HOST) for h in (1, 2, 3, 4))
    assert node.host_only([1, 2], 2) == 0
    again = node.put([5, 6], now=3.0)  # 1, 2 leave the device again: their host copies already exist
    assert again.evicted == [2, 1] and again.demoted == [] and again.dropped == []


def test_the_host_tier_evicts_a_chain_tail_first():
    node = SimKVNode("n", pages=3, host_pages=3)
    node.put([1, 2, 3], now=0.0)
    node.put([7, 8, 9], now=1.0)  # 3, 2, 1 demoted: 1 most recent in the host tier
    out = node.put([10, 11], now=2.0)  # 9, 8 demoted; the host tier drops 3 then 2
    assert out.demoted == [9, 8] and out.host_evicted == [3, 2] and out.dropped == [3, 2]
    assert node.lookup([1, 2, 3]) == 1


def test_a_lapsed_replica_is_dropped_not_demoted():
    node = SimKVNode("n", pages=2, host_pages=4)
    node.put([5], now=0.0, lease_deadline=1.0)
    node.put([6], now=0.5)
    out = node.put([7], now=2.0)
    assert out.evicted == [5] and out.dropped == [5] and 5 not in node


def test_a_replica_to_the_host_tier_evicts_nothing_from_the_device_tier():
    node = SimKVNode("n", pages=2, host_pages=3)
    node.put([1, 2], now=0.0)
    out = node.put([5, 6, 7], now=1.0, lease_deadline=10.0, tier=Tier.HOST)
    assert out.evicted == [] and node.tier_count(Tier.DEVICE) == 2
    assert out.stored == [5, 6, 7] and node.lookup([1, 2]) == 2


def test_a_replica_the_host_tier_cannot_hold_without_evicting_itself_lands_nowhere():
    node = SimKVNode("n", pages=2, host_pages=3)
    node.put([5, 6], now=0.0, lease_deadline=10.0, tier=Tier.HOST)
    out = node.put([5, 6, 7, 8], now=1.0, lease_deadline=10.0, tier=Tier.HOST)  # 2 new blocks, 1 page to spare
    assert out.stored == [] and out.host_evicted == [] and node.tier_count(Tier.HOST) == 2


def test_a_host_put_skips_blocks_the_device_tier_holds():
    node = SimKVNode("n", pages=2, host_pages=2)
    node.put([1], now=0.0)
    assert node.put([1, 2], now=1.0, tier=Tier.HOST).stored == [2]


def test_a_host_put_on_a_node_without_a_host_tier_is_an_error():
    with pytest.raises(ValueError, match="no host tier"):
        SimKVNode("n", pages=2).put([1], now=0.0, tier=Tier.HOST)


@pytest.mark.parametrize("seed", range(5))
def test_events_from_outcomes_leave_a_holder_index_in_the_node_s_final_state(seed):
    """Random puts, promotions and host replicas on a small tiered node: the
    scheduler's index, fed the events each outcome makes, always agrees with
    the node on which blocks it holds and which only its host tier holds."""
    rng = random.Random(seed)
    node = SimKVNode("n", pages=4, host_pages=3)
    index = HolderIndex()
    for step in range(300):
        chain = [rng.randrange(12) for _ in range(rng.randint(1, 6))]
        chain = list(dict.fromkeys(chain))
        tier = Tier.HOST if rng.random() < 0.2 else Tier.DEVICE
        lease = step + rng.choice([0.5, 3.0]) if rng.random() < 0.3 else None
        out = node.put(chain, float(step), lease, tier)
        index.apply(NodeId("n"), IndexEvent(HolderEventKind.STORED, out.stored, tier=tier))
        index.apply(NodeId("n"), IndexEvent(HolderEventKind.STORED, out.demoted, tier=Tier.HOST))
        index.apply(NodeId("n"), IndexEvent(HolderEventKind.REMOVED, out.evicted, tier=Tier.DEVICE))
        index.apply(NodeId("n"), IndexEvent(HolderEventKind.REMOVED, out.host_evicted, tier=Tier.HOST))
        everything = list(range(12))
        assert {h for h in everything if h in node} == {h for h in everything if index.holders(h)}
        for h in everything:
            assert index.host_only_count(NodeId("n"), [h], 1) == (h in node and not node.in_tier(h, Tier.DEVICE))


# --- the disk tier (issue 44) ----------------------------------------------------------

def test_a_block_the_host_tier_evicts_goes_to_the_disk_not_lost():
    node = SimKVNode("n", pages=1, host_pages=1, disk_pages=4)
    node.put([1], now=0.0)
    node.put([2], now=1.0)  # 1 demoted to the host tier
    out = node.put([3], now=2.0)  # 2 demoted, 1 written back to the disk
    assert out.host_evicted == [1] and out.disk_stored == [1] and out.dropped == []
    assert 1 in node and node.in_tier(1, Tier.DISK) and node.tier_count(Tier.DISK) == 1
    assert node.lookup([1]) == 1 and node.host_only([1], 1) == 1 and node.disk_only([1], 1) == 1


def test_the_disk_evicts_its_least_recent_block_and_that_block_leaves_the_node():
    node = SimKVNode("n", pages=1, host_pages=1, disk_pages=2)
    for step, h in enumerate([1, 2, 3, 4]):
        node.put([h], now=float(step))  # 1 and 2 reach the disk
    node.lookup([1])  # 1 is used: 2 is now the disk's least recent
    out = node.put([5], now=9.0)  # 3 comes down to the disk, evicting 2
    assert out.disk_stored == [3] and out.disk_evicted == [2] and out.dropped == [2]
    assert 2 not in node and 1 in node and len(node) == 5 - 1


def test_a_promotion_from_the_disk_gives_a_device_copy_and_keeps_the_disk_copy():
    node = SimKVNode("n", pages=1, host_pages=1, disk_pages=4)
    for step, h in enumerate([1, 2, 3]):
        node.put([h], now=float(step))
    out = node.put([1], now=5.0, promote=True)
    assert out.stored == [1] and node.in_tier(1, Tier.DEVICE) and node.in_tier(1, Tier.DISK)
    assert node.disk_only([1], 1) == 0


def test_a_lapsed_replica_the_host_tier_evicts_is_not_written_to_the_disk():
    node = SimKVNode("n", pages=1, host_pages=1, disk_pages=4)
    node.put([7], now=0.0, lease_deadline=1.0, tier=Tier.HOST)
    out = node.put([8], now=2.0, tier=Tier.HOST)
    assert out.host_evicted == [7] and out.disk_stored == [] and out.dropped == [7]


def test_a_disk_tier_needs_a_host_tier():
    with pytest.raises(ValueError, match="needs a host tier"):
        SimKVNode("n", pages=2, disk_pages=4)


def test_a_stage_reads_disk_blocks_into_the_host_tier_as_the_live_store_does():
    node = SimKVNode("n", pages=1, host_pages=2, disk_pages=8)
    for step, h in enumerate([1, 2, 3, 4, 5]):
        node.put([h], now=float(step))  # 1, 2 on the disk; 3, 4 host; 5 device
    out = node.stage([1, 2, 9], now=9.0)
    assert out.stored == [1, 2] and sorted(out.host_evicted) == [3, 4] and sorted(out.disk_stored) == [3, 4]
    assert out.dropped == [] and all(node.in_tier(h, Tier.HOST) and node.in_tier(h, Tier.DISK) for h in (1, 2))
    assert node.disk_only([1, 2], 2) == 0 and node.host_only([1, 2], 2) == 2
    assert node.stage([1, 5], now=10.0).stored == []  # nothing only the disk holds


def test_a_stage_never_pushes_out_the_chain_s_own_host_copies():
    node = SimKVNode("n", pages=1, host_pages=2, disk_pages=8)
    for step, h in enumerate([1, 2, 3, 4]):
        node.put([h], now=float(step))  # 1 on the disk; 2, 3 host; 4 device
    out = node.stage([3, 1], now=9.0)  # 3 is the chain's host copy: 2 goes down instead
    assert out.stored == [1] and out.host_evicted == [2] and node.in_tier(3, Tier.HOST)

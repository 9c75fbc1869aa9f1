"""The simulator's tiered node agrees with the live tiered kvstore, and the
scheduler's index agrees with both: a scripted two-node scenario (random
puts, routed reuse with promotion, replicas into the host tier, leases
lapsing, retentions, with and without a host tier, and with a disk tier
below it: host evictions written back, disk hits staged up, stage orders)
run on two KVStoreCores and two SimKVNodes. After every step each
block is in the same tiers on both, and a HolderIndex fed the live stores'
events (through the proto and the scheduler's event decoding, the live path)
holds what a HolderIndex fed the simulator's outcomes holds.

With a disk: the live store stages a disk hit through a host page before
promoting it; the simulator's request path skips that page (kvnode.py says
so), so here a reuse of disk blocks drives the simulated node as the live
store runs: SimKVNode.stage, then the promotion. What is compared is that
the two nodes' objects agree step for step, not that shortcut."""
from __future__ import annotations

import random

import pytest

from speckv.loadgen.sim.kvnode import PutOutcome, SimKVNode
from speckv.services.common.clock import ManualClock
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import MemoryMedium
from speckv.services.kvstore.store import KVStoreCore
from speckv.services.kvstore.store_disk import DiskSettings
from speckv.services.kvstore.servicer import event_to_proto
from speckv.services.scheduler.adapters.event_sync import to_index_event
from speckv.services.scheduler.holder_index import HolderEventKind, HolderIndex, IndexEvent
from tests.support.kvstore_service import TINY, block_bytes, make_store, retained_events, writes

NODES = ("a", "b")
UNIVERSE = range(1, 40)


class Scenario:
    def __init__(self, device: int, host: int, retain_share: float = 0.5, disk: int = 0) -> None:
        self.clock = ManualClock(100.0)
        self.host = host
        self.live = {n: self._live(n, device, host, retain_share, disk) for n in NODES}
        self.sim = {n: SimKVNode(n, device, host, int(retain_share * (host or device)), disk) for n in NODES}
        self.live_index, self.sim_index = HolderIndex(), HolderIndex()
        self.seen = {n: 0 for n in NODES}

    def _live(self, node: str, device: int, host: int, retain_share: float, disk: int) -> KVStoreCore:
        if not disk:
            return make_store(num_pages=device, host_pages=host, node_id=node, clock=self.clock, retention=100_000,
                              retain_max_share=retain_share)
        medium = MemoryMedium(disk, records.record_bytes(TINY.bytes_per_block))
        return KVStoreCore(node, TINY, device, self.clock, event_retention=100_000, host_pages=host,
                           retain_max_share=retain_share, disk=DiskSettings(medium, inline=True))

    def put(self, node: str, chain: list[int]) -> None:
        self.live[node].put_blocks(writes(*chain))
        self._sim_events(node, self.sim[node].put(chain, self.clock.now()), HolderEventKind.STORED, Tier.DEVICE)

    def reuse(self, node: str, chain: list[int]) -> None:
        """A routed request: Lookup confirms the prefix, then its host hits are promoted."""
        prefix = self.live[node].lookup(chain).prefix_blocks
        assert self.sim[node].lookup(chain) == prefix
        if prefix:
            self.live[node].promote(chain[:prefix])
            if self.sim[node].disk_only(chain, prefix):  # the live promote's staging (module docstring)
                self._sim_events(node, self.sim[node].stage(chain[:prefix], self.clock.now()),
                                 HolderEventKind.STORED, Tier.HOST)
            if self.sim[node].host_only(chain, prefix):
                self._sim_events(node, self.sim[node].put(chain[:prefix], self.clock.now(), promote=True),
                                 HolderEventKind.STORED, Tier.DEVICE)

    def stage(self, node: str, chain: list[int]) -> None:
        """A stage order: the disk-only blocks of the held prefix up into the host tier."""
        out = self.sim[node].stage(chain, self.clock.now())
        assert self.live[node].stage(chain) == len(out.stored)
        self._sim_events(node, out, HolderEventKind.STORED, Tier.HOST)

    def retain(self, node: str, chain: list[int], ttl_s: float) -> None:
        now = self.clock.now()
        assert self.live[node].retain(chain, ttl_s) == self.sim[node].retain(chain, now + ttl_s, now)

    def replicate(self, source: str, target: str, chain: list[int], lease_s: float) -> None:
        held = 0  # the source's prefix, read without a use (a replication source's reads are none)
        while held < len(chain) and self.live[source].tier_of(chain[held]) is not None:
            held += 1
        if not held:
            return
        copy = chain[:held]
        grant = self.live[target].reserve("o", copy, 10.0, family="f", tier=Tier.HOST)
        if grant.hashes:
            data = b"".join(block_bytes(h) for h in grant.hashes)
            self.live[target].write_chunk(grant.handle, 0, data, crc32c(data))
        self.live[target].commit(grant.handle, {0: crc32c(data)} if grant.hashes else {}, lease_s)
        out = self.sim[target].put(copy, self.clock.now(), lease_deadline=self.clock.now() + lease_s, tier=Tier.HOST)
        self._sim_events(target, out, HolderEventKind.COMMITTED, Tier.HOST)

    def _sim_events(self, node: str, out: PutOutcome, kind: HolderEventKind, tier: Tier) -> None:
        """The events loadgen/sim/simulation.py makes of an outcome, in its order."""
        n = NodeId(node)
        for event in (IndexEvent(kind, out.stored, tier=tier), IndexEvent(HolderEventKind.STORED, out.demoted,
                                                                          tier=Tier.HOST),
                      IndexEvent(HolderEventKind.STORED, out.disk_stored, tier=Tier.DISK),
                      IndexEvent(HolderEventKind.REMOVED, out.evicted, tier=Tier.DEVICE),
                      IndexEvent(HolderEventKind.REMOVED, out.host_evicted, tier=Tier.HOST),
                      IndexEvent(HolderEventKind.REMOVED, out.disk_evicted, tier=Tier.DISK)):
            if event.block_hashes:
                self.sim_index.apply(n, event)

    def check(self) -> None:
        for node in NODES:
            for event in retained_events(self.live[node]):
                if event.sequence > self.seen[node]:
                    self.live_index.apply(NodeId(node), to_index_event(event_to_proto(event)))
                    self.seen[node] = event.sequence
            live_host = self.live[node]._host
            # The same eviction order too (nothing is pinned between steps).
            assert self.live[node]._device.index.eviction_order() == self.sim[node]._device.index.eviction_order(), node
            if live_host is not None:
                assert live_host.index.eviction_order() == self.sim[node]._host.index.eviction_order(), node
            live_disk = self.live[node]._disk
            if live_disk is not None:
                assert live_disk.index.eviction_order() == self.sim[node]._disk.index.eviction_order(), node
            for h in UNIVERSE:
                live_tiers = (h in self.live[node]._device.index, live_host is not None and h in live_host.index,
                              live_disk is not None and h in live_disk.index)
                sim_tiers = (self.sim[node].in_tier(h, Tier.DEVICE), self.sim[node].in_tier(h, Tier.HOST),
                             self.sim[node].in_tier(h, Tier.DISK))
                assert live_tiers == sim_tiers, (node, h)
                n = NodeId(node)
                assert (n in self.live_index.holders(h)) == (n in self.sim_index.holders(h)) == any(live_tiers)
                assert self.live_index.host_only_count(n, [h], 1) == self.sim_index.host_only_count(n, [h], 1)
                assert self.live_index.disk_only_count(n, [h], 1) == self.sim_index.disk_only_count(n, [h], 1)


@pytest.mark.parametrize("host, disk", [(8, 0), (0, 0), (6, 10)])
@pytest.mark.parametrize("seed", range(6))
def test_live_store_simulator_and_index_agree_on_a_two_node_scenario(seed, host, disk):
    rng = random.Random(seed)
    scenario = Scenario(device=6, host=host, disk=disk)
    conversations = [[100 * c + k for k in range(1, rng.randint(2, 5))] for c in range(1, 9)]
    universe = {h for chain in conversations for h in chain}
    global UNIVERSE
    UNIVERSE = sorted(universe)
    for _ in range(250):
        chain = rng.choice(conversations)
        node = rng.choice(NODES)
        roll = rng.random()
        if roll < 0.45:
            scenario.reuse(node, chain)
            scenario.put(node, chain)
        elif roll < 0.7:
            scenario.put(node, chain)
        elif roll < 0.78 and host:
            other = "b" if node == "a" else "a"
            scenario.replicate(node, other, chain, rng.choice([0.5, 5.0]))
        elif roll < 0.82:
            scenario.retain(node, chain, rng.choice([0.5, 4.0, 20.0]))
        elif roll < 0.85 and disk:
            scenario.stage(node, chain)
        else:
            scenario.clock.advance(rng.choice([0.2, 1.0, 3.0]))
        scenario.check()

"""A returning request whose KV only its node's disk holds: the simulator
reads it over the node's disk link, then copies it over the host link, in
virtual time, before its prefill; the router priced it as a disk load."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim import scheduler_side
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.ids import Family
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.common.traces import TraceRequest
from speckv.services.scheduler.orders import ActionKind, OrderSpec

CONFIG = load_e2e_config()
B = 512  # tokens per block
DISK = LinkModel(41.6, 0.09)  # one Gen4 drive at 0.8 of 6.5 GB/s, as nvme-gen4


def req(t: float, first: int, family: str) -> TraceRequest:
    return TraceRequest(t, 4 * B + 100, 1, tuple(range(first, first + 4)), B, family)


def simulate(disk_pages: int):
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG, nodes=1), drain_s=60.0, sizes=NodeSizes(4, 4, 0),
                                   disk_pages=disk_pages, disk=DISK)
    # a at 0; b pushes a to the host tier; c pushes b there and a down to the disk; a returns.
    requests = [req(0.0, 1, "a"), req(5.0, 11, "b"), req(10.0, 21, "c"), req(20.0, 1, "a")]
    sim = Simulation(CONFIG, settings, "none", requests)
    return sim, sim.run()


def test_a_disk_hit_is_read_then_copied_up_before_prefill():
    sim, run = simulate(16)
    back = run.records[-1]
    assert back.served and back.cached_tokens == 4 * B and back.promoted_tokens == 4 * B
    nbytes = 4 * CONFIG.real_bytes_per_block
    assert CONFIG.host_link is not None
    assert back.promote_ms == pytest.approx(DISK.transfer_ms(nbytes) + CONFIG.host_link.transfer_ms(nbytes), rel=1e-6)
    node = sim.kv[back.node_id]
    assert all(node.in_tier(h, Tier.DEVICE) and node.in_tier(h, Tier.DISK) for h in range(1, 5))


def test_without_the_disk_the_same_request_recomputes():
    _, run = simulate(0)
    back = run.records[-1]
    assert back.served and back.cached_tokens == 0 and back.promoted_tokens == 0


def test_the_record_tells_a_disk_load_from_a_host_hit():
    _, run = simulate(16)
    back = run.records[-1]
    assert back.disk_tokens == 4 * B and back.promoted_tokens == 4 * B
    assert all(r.disk_tokens == 0 for r in run.records[:-1])


def test_a_request_arriving_while_a_stage_reads_its_blocks_waits_for_that_read():
    """Issue 44 (b): a stage order for a's blocks starts 20 ms before a
    returns; a's request joins that read (it ends at 19.98 s + one read)
    instead of reading the blocks again beside it, then copies them up."""
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG, nodes=1), drain_s=60.0, sizes=NodeSizes(4, 4, 0),
                                   disk_pages=16, disk=DISK)
    requests = [req(0.0, 1, "a"), req(5.0, 11, "b"), req(10.0, 21, "c"), req(20.0, 1, "a")]
    sim = Simulation(CONFIG, settings, "none", requests)
    node = sim.ids[0]
    spec = OrderSpec(Family("a"), [1, 2, 3, 4], node, node, 15000, tier=Tier.HOST, action=ActionKind.STAGE)
    sim.queue.at(19.98, lambda: scheduler_side.replicate(sim, sim.core.submit_order(spec)))
    run = sim.run()
    back = run.records[-1]
    nbytes = 4 * CONFIG.real_bytes_per_block
    assert CONFIG.host_link is not None
    landed_s = 19.98 + DISK.transfer_ms(nbytes) / 1e3
    assert back.served and back.disk_tokens == 4 * B and back.cached_tokens == 4 * B
    assert back.promote_ms == pytest.approx((landed_s - 20.0) * 1e3 + CONFIG.host_link.transfer_ms(nbytes), rel=1e-6)
    assert (sim.stage_reads.joined_reads, sim.stage_reads.joined_blocks) == (1, 4)
    assert sim.disk_links is not None and sim.disk_links.stats[f"{node}/disk"].bytes == nbytes  # read once


def test_a_pull_reads_the_blocks_only_its_sources_disk_holds():
    """node-0 holds a's blocks on its disk alone and is busy, so a goes to
    node-1 and pulls them over a 400 Gbit/s network: node-0 reads them off
    its disk while the wire carries them, and the pull lands when both have
    (51.7 ms of disk read against 5.4 ms of wire), as the router priced it;
    the scheduler booked that read on node-0's disk. Before, the pull took
    the wire's 5.4 ms and node-0's disk stayed idle."""
    config = dataclasses.replace(CONFIG, link=LinkModel(400.0, 0.05))
    settings = dataclasses.replace(SimSettings.from_e2e(config, nodes=2), drain_s=60.0, sizes=NodeSizes(4, 4, 0),
                                   disk_pages=16, disk=DISK)
    sim = Simulation(config, settings, "none", [req(1.0, 1, "a")])
    src, dst = sim.ids
    for first, family in ((1, "a"), (11, "b"), (21, "c")):  # a ends on the disk alone: b and c push it down
        hashes = list(range(first, first + 4))
        sim._apply(src, sim.kv[src].put(hashes, sim.queue.now()), hashes[0], family, sim.queue.now())
    assert sim.kv[src].disk_only_hashes([1, 2, 3, 4], 4) == [1, 2, 3, 4]
    waits: list[float] = []
    sim.core.heartbeat(src, NodeLoad(queued_tokens=200_000))  # at the arrival, before the first heartbeat round
    sim.queue.at(1.0 + 1e-4, lambda: waits.append(sim.core._view(sim.queue.now()).disk_wait_ms.get(src, 0.0)))
    run = sim.run()
    back = run.records[-1]
    nbytes = 4 * config.real_bytes_per_block
    assert back.served and back.node_id == dst and back.fetch_from == src and back.fetched_tokens == 4 * B
    assert back.fetch_ms == pytest.approx(DISK.transfer_ms(nbytes), rel=1e-6)
    assert sim.disk_links is not None and sim.disk_links.stats[f"{src}/disk"].bytes == nbytes
    assert waits == [pytest.approx(DISK.transfer_ms(nbytes) - 0.1, rel=1e-6)]

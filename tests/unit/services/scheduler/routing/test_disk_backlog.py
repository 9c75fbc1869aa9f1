"""Each node's disk backlog (services/scheduler/routing/disk_backlog.py):
reads booked FIFO per node, stages remembered by their chain until they
land, disk-load rates decayed; and the core books what it routes and
orders on it, so a second load behind the first waits."""
from __future__ import annotations

import math

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import LinkModel, get_profile
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.orders import ActionKind, OrderSpec
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.routing.disk_backlog import DiskBacklog
from tests.support.scheduler_scenarios import BS, CHAIN, FAMILY, heartbeat_all, load, make_core

DISK = LinkModel(41.6, overhead_ms=0.09)  # nvme-gen4: 5.2 GB/s
GIB = 2**30
A, B = NodeId("a"), NodeId("b")


def test_reads_on_one_disk_queue_and_other_disks_are_free():
    disks = DiskBacklog(DISK)
    read_s = DISK.transfer_ms(GIB) / 1e3
    assert disks.add(A, GIB, 10.0) == pytest.approx(10.0 + read_s)
    assert disks.add(A, GIB, 10.0) == pytest.approx(10.0 + 2 * read_s)
    assert disks.wait_ms(A, 10.0) == pytest.approx(2e3 * read_s)
    assert disks.wait_ms(A, 10.0 + read_s) == pytest.approx(1e3 * read_s)
    assert disks.wait_ms(B, 10.0) == 0.0 and disks.waits(10.0) == {A: pytest.approx(2e3 * read_s)}
    disks.prune(10.0 + 2 * read_s)
    assert disks.waits(10.0) == {}


def test_a_stage_is_joined_by_a_prefix_ending_in_its_chain_until_it_lands():
    disks = DiskBacklog(DISK)
    disks.add(A, GIB, 0.0)  # a load before it: the stage queues behind
    end = disks.add_stage(A, [1, 2, 3], 2, 64 * 2**20, 0.0)
    assert end == pytest.approx((DISK.transfer_ms(GIB) + DISK.transfer_ms(128 * 2**20)) / 1e3)
    assert disks.joined_ms(A, 2, 0.0) == pytest.approx(end * 1e3)
    assert disks.joined_ms(A, 3, end / 2) == pytest.approx(end * 1e3 / 2)
    assert disks.joined_ms(A, 4, 0.0) is None and disks.joined_ms(B, 2, 0.0) is None
    assert disks.joined_ms(A, 2, end) is None  # landed
    disks.forget(A)
    assert disks.joined_ms(A, 2, 0.0) is None and disks.wait_ms(A, 0.0) == 0.0


def test_without_a_disk_model_nothing_is_booked():
    disks = DiskBacklog(None)
    assert disks.add(A, GIB, 5.0) == 5.0
    disks.add_stage(A, [1], 1, GIB, 5.0)
    assert disks.wait_ms(A, 5.0) == 0.0 and disks.joined_ms(A, 1, 5.0) is None


def test_disk_load_rates_decay_with_their_half_life():
    disks = DiskBacklog(DISK, rate_halflife_s=10.0)
    for _ in range(4):
        disks.note_load(A, 0.0)
    assert disks.rate_per_s(A, 0.0) == pytest.approx(4 * math.log(2) / 10.0)
    assert disks.rate_per_s(A, 10.0) == pytest.approx(2 * math.log(2) / 10.0)
    assert disks.rates(10.0) == {A: pytest.approx(2 * math.log(2) / 10.0)}


def _disk_core():
    """Two nodes; n0 holds CHAIN (128 blocks of 2 MiB) on its disk alone,
    read at 5.2 GB/s (51.7 ms), n1 nothing."""
    core, clock = make_core(2, "none", capacity=512, host_pages=1024, disk_gbps=41.6)
    assert core.apply_kv_event(NodeId("n0"), core.generation("n0"),
                               IndexEvent(HolderEventKind.STORED, CHAIN, False, FAMILY, tier=Tier.DISK))
    heartbeat_all(core, 2)
    return core, clock


def test_a_routed_disk_load_holds_the_disk_for_the_next():
    """The first request loads CHAIN off n0's disk (the answer says how
    many blocks come off it). A second at the same instant would wait for
    that read, then read its own: 57 + 52 ms before its prefill, dearer
    than recomputing on the idle n1 (90 ms), where it goes; priced on an
    idle disk it would have followed the first to n0 (73 ms)."""
    core, _ = _disk_core()
    prompt = (len(CHAIN) + 1) * BS
    first = core.route("r1", CHAIN + [1], prompt, FAMILY)
    assert (first.node_id, first.cached_blocks, first.disk_blocks) == ("n0", 128, 128)
    second = core.route("r2", CHAIN + [2], prompt, FAMILY)
    assert (second.node_id, second.cached_blocks) == ("n1", 0)
    assert second.expected_ttft_ms > first.expected_ttft_ms


def test_a_request_joins_a_stage_of_its_prefix_in_flight():
    """A stage order on n0 books its read; a request for the staged prefix
    then waits for that stage's end (its answer: the stage's remaining
    read, no read of its own: one read, not two, before the host copy)."""
    core, _ = _disk_core()
    core.submit_order(OrderSpec(FAMILY, list(CHAIN), "n0", "n0", 15000, tier=Tier.HOST, action=ActionKind.STAGE))
    read_ms = DISK.transfer_ms(len(CHAIN) * 2 * 2**20)
    routed = core.route("r1", CHAIN + [1], (len(CHAIN) + 1) * BS, FAMILY)
    assert (routed.node_id, routed.disk_blocks) == ("n0", 128)
    host_ms = LinkModel(400.0, 0.05).transfer_ms(len(CHAIN) * 2 * 2**20)
    assert routed.promote_ms == pytest.approx(read_ms + host_ms)


def test_a_pull_off_a_holders_disk_holds_that_disk():
    """n0 is busy, so the request goes to n1 and pulls CHAIN from n0 over
    a 400 Gbit/s network, n0's disk alone holding it: n0 stages the blocks
    off its disk before it serves them, so that read is booked on n0's disk
    (one read of the 128 blocks, counted as a disk load there) as n0's own
    loads are. Before, only the wire was booked and n0's disk looked idle."""
    config = load_policy_config()
    clock = ManualClock(100.0)
    core = SchedulerCore(SchedulerSettings(node_timeout_s=5.0, policy_config=config, link_gbps=400.0,
                                           link_overhead_ms=0.05, host_link_gbps=400.0, host_link_overhead_ms=0.05,
                                           disk_gbps=41.6, disk_overhead_ms=0.09),
                         clock, get_profile("llama-3-8b-h100"))
    for i in range(2):
        core.register_node(f"n{i}", f"127.0.0.1:{7000 + i}", NodeSizes(512, 1024), None)
    assert core.apply_kv_event(NodeId("n0"), core.generation("n0"),
                               IndexEvent(HolderEventKind.STORED, CHAIN, False, FAMILY, tier=Tier.DISK))
    heartbeat_all(core, 2)
    load(core, "n0", 200_000)
    routed = core.route("r1", CHAIN + [1], (len(CHAIN) + 1) * BS, FAMILY)
    assert (routed.node_id, routed.fetch_from, routed.fetch_blocks) == ("n1", "n0", 128)
    view = core._view(clock.now())
    assert view.disk_wait_ms == {NodeId("n0"): pytest.approx(DISK.transfer_ms(len(CHAIN) * 2 * 2**20))}
    assert view.disk_loads_per_s[NodeId("n0")] > 0

"""Staging ahead of the return (issue 44, item 5): the planner prices a
holder's disk-only blocks as disk reads, and orders them read into its host
tier (ActionKind.STAGE) when the forecast requests save more than the host
blocks they push down cost."""
import dataclasses
import math

import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.orders import ActionKind, OrderSpec
from speckv.services.scheduler.policy_config import load_policy_config
from tests.support.scheduler_scenarios import CHAIN, FAMILY, ScriptedForecasts, heartbeat_all, make_core, \
    route_family, store

DISK_GBPS = 41.6  # nvme-gen4: 5.2 GB/s
BLOCK = 2 * 2**20  # llama-3-8b, 16-token blocks
HOST_MS = 128 * BLOCK * 8 / 400e9 * 1e3 + 0.05  # the host link's copy of the chain
DISK_MS = 128 * BLOCK * 8 / DISK_GBPS / 1e9 * 1e3 + 0.09  # its read off the disk


def disk_holder(device_full: bool = True, host_full: bool = False, disk_gbps: float = DISK_GBPS,
                p_reuse: float = 1.0, **planner):
    return clocked_disk_holder(device_full, host_full, disk_gbps, p_reuse, **planner)[0]


def clocked_disk_holder(device_full: bool = True, host_full: bool = False, disk_gbps: float = DISK_GBPS,
                        p_reuse: float = 1.0, other_loads: int = 0, **planner):
    """One node holding CHAIN on its disk alone; a request there would read
    it (DISK_MS), copy it up (HOST_MS), then prefill. A block pushed out of a
    tier is wanted again with P(reuse) = p_reuse."""
    forecasts = ScriptedForecasts()
    planner = {"horizon_s": 2.0, "stage": True, **planner}  # off as committed (policies.json says why)
    core, clock = make_core(1, "predictive", forecasts, capacity=512, host_pages=1024, disk_gbps=disk_gbps,
                            planner=planner, reuse={"prior_p": p_reuse, "prior_weight": 1e6})
    assert core.apply_kv_event(NodeId("n0"), core.generation("n0"),
                               IndexEvent(HolderEventKind.STORED, CHAIN, False, FAMILY, tier=Tier.DISK))
    route_family(core, 2)
    if device_full:
        store(core, "n0", list(range(900_000, 900_512)), family="filler")
    if host_full:
        assert core.apply_kv_event(NodeId("n0"), core.generation("n0"), IndexEvent(
            HolderEventKind.STORED, list(range(800_000, 801_024)), False, "host-filler", tier=Tier.HOST))
    clock.advance(0.2 if other_loads else 0.0)  # the family's own loads above are read by then
    for i in range(other_loads):  # other families' 8-block loads off n0's disk, 5 ms apart (each reads 3.3)
        chain = list(range(700_000 + 8 * i, 700_008 + 8 * i))
        assert core.apply_kv_event(NodeId("n0"), core.generation("n0"), IndexEvent(
            HolderEventKind.STORED, chain, False, f"other-{i}", tier=Tier.DISK))
        assert core.route(f"other-{i}", chain + [1], 9 * 16, f"other-{i}").disk_blocks == 8
        clock.advance(0.005)
        if i % 200 == 199:
            heartbeat_all(core, 1)  # alive (5 s timeout)
    heartbeat_all(core, 1)
    forecasts.counts = {FAMILY: 1.0}
    return core, clock


def test_a_stage_takes_the_disk_read_off_the_critical_path():
    """The device tier is full (a prefetch would demote 128 blocks wanted
    again), the host tier empty: reading the chain into the host tier saves
    the disk read and pushes nothing out. Its price: the delay its read
    adds to the disk loads routed to n0, one so far (the first route loaded
    the chain; the second, behind that read, recomputed): ln 2 / 30 s a
    second x T/1000 x T/2 (disk_backlog.py, value.link_delay_ms)."""
    orders = disk_holder().tick()
    assert [(o.spec.action, o.spec.source, o.spec.target, o.spec.tier) for o in orders] == [
        (ActionKind.STAGE, "n0", "n0", Tier.HOST)]
    assert orders[0].spec.block_hashes == CHAIN and orders[0].spec.lease_ms == 15000
    delay = math.log(2) / 30.0 * DISK_MS / 1e3 * DISK_MS / 2
    assert orders[0].spec.expected_benefit_ms == pytest.approx(DISK_MS - delay)


def test_a_prefetch_of_disk_blocks_is_priced_with_their_read():
    """With staging off the prefetch is worth the read and the copy, less
    its 128 demotions at one promotion (2 MiB over the host link) each."""
    orders = disk_holder(stage=False).tick()
    assert [o.spec.action for o in orders] == [ActionKind.PREFETCH]
    demotions = 128 * (BLOCK * 8 / 400e9 * 1e3 + 0.05)
    assert orders[0].spec.expected_benefit_ms == pytest.approx(DISK_MS + HOST_MS - demotions)


def test_the_committed_planner_stages_nothing():
    assert disk_holder(stage=load_policy_config().planner.stage).tick()[0].spec.action is ActionKind.PREFETCH


def test_without_a_disk_model_disk_blocks_are_host_hits_and_nothing_is_staged():
    """No --disk-gbps: priced as before disks (the prefetch saves 5.4 ms and
    demotes 11.8 ms of blocks wanted again): no order at all."""
    assert disk_holder(disk_gbps=0.0).tick() == []


@pytest.mark.parametrize("p_reuse, staged", [(1.0, False), (0.01, True)])
def test_a_stage_that_pushes_out_host_blocks_wanted_again_costs_more_than_it_saves(p_reuse, staged):
    """A full host tier: the stage pushes 128 host blocks down to the disk,
    each priced at P(reuse) of the host tier x one block's disk read (0.49
    ms, its 0.09 ms overhead paid per block); wanted again for sure, that is
    more than the chain's read in one load.
    (Prefetch off: with P(reuse) low it would be worth more still.)"""
    orders = disk_holder(host_full=True, p_reuse=p_reuse, prefetch=False).tick()
    assert any(o.spec.action is ActionKind.STAGE for o in orders) is staged
    if staged:
        assert 0 < orders[0].spec.expected_benefit_ms < DISK_MS


def test_a_stage_in_flight_is_joined_not_issued_twice():
    """Issue 44 (a, b): the stage issued by the first tick holds n0's disk
    (booked in the disk backlog); the next tick prices n0's disk read as
    joining that stage and issues no second one while it is in flight."""
    core, clock = clocked_disk_holder(plan_every_s=0.01)
    assert [o.spec.action for o in core.tick()] == [ActionKind.STAGE]
    clock.advance(0.02)  # the next plan, within its 51.7 ms read
    assert core.tick() == []


@pytest.mark.parametrize("loads, staged", [(100, True), (3000, False)])
def test_a_stage_pays_the_delay_its_read_adds_to_the_disk_loads_routed_there(loads, staged):
    """Other families' loads off n0's disk, 5 ms apart, each done before
    the next: no backlog, but a rate r of them a second (disk_backlog.py:
    decayed with a 30 s half-life). The stage's 51.7 ms read delays each
    arriving during it by half of it on average: r x 51.7 ms/1000 x 51.7 ms
    / 2, against the 51.7 ms it saves. 100 loads (r ~ 2.3/s) cost 3 ms:
    staged; 3000 (r ~ 59/s) cost 78 ms: not."""
    core, _ = clocked_disk_holder(other_loads=loads)
    orders = core.tick()
    assert any(o.spec.action is ActionKind.STAGE for o in orders) is staged
    if staged:
        rate = math.log(2) / 30 * sum(2 ** (-k * 0.005 / 30) for k in range(1, loads + 1))
        stage = next(o for o in orders if o.spec.action is ActionKind.STAGE)
        assert stage.spec.expected_benefit_ms == pytest.approx(DISK_MS - rate * DISK_MS ** 2 / 2e3, rel=0.02)


def test_a_stage_lands_in_the_host_tier_of_a_node_that_has_one():
    core, _ = make_core(2, host_pages=0)
    spec = OrderSpec(FAMILY, CHAIN, "n0", "n0", 15000, action=ActionKind.STAGE)
    with pytest.raises(FailedPrecondition, match="host tier"):
        core.submit_order(spec)
    core, _ = make_core(2, host_pages=64)
    with pytest.raises(InvalidArgument, match="host tier"):
        core.submit_order(dataclasses.replace(spec, tier=Tier.DEVICE))
    with pytest.raises(InvalidArgument, match="one node"):
        core.submit_order(dataclasses.replace(spec, target="n1"))
    order = core.submit_order(spec)
    assert order.spec.tier is Tier.HOST and order.spec.action is ActionKind.STAGE
    assert ActionKind.parse("stage") is ActionKind.STAGE and not ActionKind.STAGE.copies

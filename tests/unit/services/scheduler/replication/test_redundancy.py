"""The redundant action: a second copy of a prefix with one holder, priced
against that holder failing (replication/redundancy.py), through the
`predictive` policy on scripted forecasts and through its pure functions."""
import math

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.servicer import order_to_proto
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.orders import ActionKind
from speckv.services.scheduler.replication.redundancy import (
    failover_saving_ms,
    failure_probability,
    without_node,
)
from speckv.services.scheduler.replication.value import Demand, ServeOption
from tests.support.scheduler_scenarios import (
    CHAIN,
    FAMILY,
    ScriptedForecasts,
    heartbeat_all,
    make_core,
    route_family,
    store,
)

STRESS = 3600.0  # one failure per node-second: a stress rate, far above any published one
HOST = 128  # host pages per node: exactly one copy of CHAIN


def sole_holder(rate, holders=("n0",), nodes=4, count=200.0, full_targets=True, **planner):
    """n0 (and any other of holders) holds CHAIN; the others' host tiers are
    full of another family's blocks (unless not full_targets), so a copy
    there has a price (the evictions); 200 requests forecast within 1 s.
    Returns the tick's orders."""
    forecasts = ScriptedForecasts()
    core, clock = make_core(nodes, "predictive", forecasts, host_pages=HOST,
                            planner={"horizon_s": 1.0, "plan_every_s": 0.0,
                                     "failure_rate_per_node_hour": rate, **planner})
    for node in holders:
        store(core, node, CHAIN)
    for i in range(nodes):
        if full_targets and f"n{i}" not in holders:
            other = list(range(900_000 + 1000 * i, 900_000 + 1000 * i + HOST))
            assert core.apply_kv_event(NodeId(f"n{i}"), core.generation(f"n{i}"),
                                       IndexEvent(HolderEventKind.STORED, other, False, f"other{i}", tier=Tier.HOST))
    route_family(core, 2)
    heartbeat_all(core, nodes)
    forecasts.counts = {FAMILY: count}
    return core.tick()


def redundant(orders):
    return [o for o in orders if o.spec.action is ActionKind.REDUNDANT]


def test_the_committed_rate_is_the_published_one_and_prices_a_copy_at_almost_nothing():
    planner = load_policy_config().planner
    assert planner.redundancy is True
    assert planner.failure_rate_per_node_hour == pytest.approx(419 / (54 * 24 * 16384), rel=1e-2)
    p = failure_probability(planner.failure_rate_per_node_hour, 1000.0)
    assert p == pytest.approx(5.47e-9, rel=1e-2)
    # 200 requests in 1 s; the holder hits (16 ms of prefill), a peer
    # recomputes (90 ms) or, with the copy, hits after a 5 ms promotion.
    holder = ServeOption("h", 0.0, 0.0, 16.0)
    peer = ServeOption("p", 0.0, 0.0, 90.0)
    pull = ServeOption("p", 0.0, 0.0, 16.0, pull_ms=87.0, pull_link="h")
    copy = ServeOption("p", 0.0, 5.0, 16.0, ready_ms=50.0)
    assert without_node([holder, peer, pull], "h") == [peer]
    demand = Demand(200.0, 1000.0)
    saving = failover_saving_ms([holder, peer, pull], copy, "h", demand, p)
    assert 0 < saving < 0.01  # ms, over all 200 requests
    assert failover_saving_ms([holder, peer, pull], copy, "h", demand, failure_probability(STRESS, 1000.0)) > 1e5


def test_failure_probability_is_exponential_in_the_horizon():
    assert failure_probability(0.0, 1e6) == 0.0 and failure_probability(1.0, 0.0) == 0.0
    assert failure_probability(1.0, 3.6e6) == pytest.approx(1 - math.exp(-1))
    assert failure_probability(STRESS, 1000.0) == pytest.approx(1 - math.exp(-1))


@pytest.mark.parametrize("replicate", [True, False])
def test_no_redundant_copy_at_the_committed_rate(replicate):
    orders = sole_holder(load_policy_config().planner.failure_rate_per_node_hour, replicate=replicate)
    assert redundant(orders) == []


def test_a_free_copy_worth_less_than_the_floor_is_refused():
    """Free pages and idle links price a copy at 0 ms: at the committed rate
    its saving is a millionth of a millisecond, and only the floor refuses it."""
    rate = load_policy_config().planner.failure_rate_per_node_hour
    assert redundant(sole_holder(rate, full_targets=False, replicate=False, prefetch=False)) == []
    no_floor = sole_holder(rate, full_targets=False, replicate=False, prefetch=False, redundancy_min_saving_ms=0.0)
    assert len(redundant(no_floor)) == 1


def test_a_sole_holder_gets_a_redundant_copy_in_a_peers_host_tier_at_a_stress_rate():
    orders = redundant(sole_holder(STRESS, replicate=False, prefetch=False))
    assert len(orders) == 1  # a second copy, not a third: its target is a holder for the rest of the tick
    order = orders[0]
    assert order.spec.source == "n0" and order.spec.target != "n0" and order.spec.tier is Tier.HOST
    assert order.spec.block_hashes == CHAIN and order.spec.expected_benefit_ms > 0
    assert order_to_proto(order).action == "redundant"


def test_a_redundant_copy_and_replicas_share_the_targets():
    orders = sole_holder(STRESS)
    targets = [o.spec.target for o in orders if o.spec.action.copies]
    assert len(redundant(orders)) == 1 and len(targets) == len(set(targets))  # one copy per node


def test_a_family_with_two_holders_gets_none():
    assert redundant(sole_holder(STRESS, holders=("n0", "n1"), replicate=False, prefetch=False)) == []


def test_the_switch_turns_it_off():
    assert redundant(sole_holder(STRESS, redundancy=False, replicate=False, prefetch=False)) == []


def test_wire_form():
    assert ActionKind.parse("redundant") is ActionKind.REDUNDANT
    assert ActionKind.parse("") is ActionKind.REPLICATE
    assert ActionKind.REDUNDANT.copies and ActionKind.REPLICATE.copies
    assert not ActionKind.PREFETCH.copies and not ActionKind.RETAIN.copies
    with pytest.raises(InvalidArgument, match="redundant"):
        ActionKind.parse("evict")

"""Each speculative order's outcome, per policy and action (outcomes.py)."""
import dataclasses

import pytest

from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.replication import outcomes as outcomes_module
from speckv.services.scheduler.orders import ActionKind, OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.replication.outcomes import MAX_POLICIES, ActionOutcomes
from tests.support.scheduler_scenarios import CHAIN, FAMILY, make_core, store

F = Family("conv")
BPB = 1000


def _issued(outcomes, tracker, action=ActionKind.REPLICATE, lease_ms=10_000, benefit=50.0, now=0.0):
    target = NodeId("b") if action is ActionKind.REPLICATE else NodeId("a")
    order = tracker.submit(OrderSpec(F, [1, 2, 3], NodeId("a"), target, lease_ms, expected_benefit_ms=benefit,
                                     policy="predictive", action=action), now)
    outcomes.issued(order, BPB)
    return order


def _move(outcomes, tracker, order, state, now, blocks=0):
    moved = tracker.report(order.order_id, state, now, blocks_sent=blocks)
    outcomes.transition(moved, now)
    return moved


def _outcomes_of(outcomes, action=ActionKind.REPLICATE):
    stats = outcomes.stats()[("predictive", action)]
    return {k: v for k, v in stats.outcomes.items() if v}, stats


def test_a_replica_read_after_it_landed_and_within_its_lease_was_used_in_time():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker)
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.routed(F, NodeId("a"), True, 2.0)  # the holder, not the replica: no use
    outcomes.routed(F, NodeId("b"), True, 3.0)
    counts, stats = _outcomes_of(outcomes)
    assert counts == {"used_in_time": 1}
    assert stats.bytes == 3 * BPB and stats.bytes_used_in_time_share == 1.0
    assert stats.expected_ms_by_outcome["used_in_time"] == 50.0


def test_a_request_that_came_before_the_copy_landed_makes_it_late():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker)
    outcomes.routed(F, NodeId("a"), True, 0.5)  # came while the order was still issued
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.sweep(12.0)  # the lease ran out unused
    assert _outcomes_of(outcomes)[0] == {"used_late": 1}


def test_a_late_order_still_counts_as_used_in_time_when_a_later_request_reads_it():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker)
    outcomes.routed(F, NodeId("a"), True, 0.5)
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.routed(F, NodeId("b"), True, 5.0)
    assert _outcomes_of(outcomes)[0] == {"used_in_time": 1}


@pytest.mark.parametrize("when, cached, outcome", [
    (12.0, True, "never_used"),  # read after its lease ended
    (5.0, False, "never_used"),  # routed there but found no prefix (evicted already)
])
def test_a_replica_nobody_read_in_time_was_never_used(when, cached, outcome):
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker)
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.routed(F, NodeId("b"), cached, when)
    outcomes.sweep(20.0)
    assert _outcomes_of(outcomes)[0] == {outcome: 1}


@pytest.mark.parametrize("state, outcome", [(OrderState.CANCELLED, "cancelled"), (OrderState.FAILED, "failed"),
                                            (OrderState.EXPIRED, "failed")])
@pytest.mark.parametrize("wanted_while_pending", [False, True])
def test_orders_that_never_landed(state, outcome, wanted_while_pending):
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker)
    if wanted_while_pending and state is not OrderState.CANCELLED:
        outcomes.routed(F, NodeId("a"), True, 0.5)  # late, but it never landed: failed all the same
    _move(outcomes, tracker, order, state, 1.0)
    assert _outcomes_of(outcomes)[0] == {outcome: 1}
    outcomes.routed(F, NodeId("b"), True, 2.0)  # closed: nothing changes
    assert _outcomes_of(outcomes)[0] == {outcome: 1}


@pytest.mark.parametrize("action", [ActionKind.PREFETCH, ActionKind.RETAIN])
def test_a_one_node_action_counts_the_bytes_it_promoted_or_retained_and_its_holders_reads(action):
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker, action=action)
    assert outcomes.stats()[("predictive", action)].bytes == 0  # nothing promoted or retained yet
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0, blocks=2)  # one block was in the device tier / over the cap
    outcomes.routed(F, NodeId("b"), True, 1.5)  # another node's read is not this order's
    outcomes.routed(F, NodeId("a"), True, 2.0)
    counts, stats = _outcomes_of(outcomes, action)
    assert counts == {"used_in_time": 1} and stats.bytes == 2 * BPB


def test_a_retain_whose_conversation_came_back_after_its_lease_was_never_used():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker, action=ActionKind.RETAIN, lease_ms=300_000)
    _move(outcomes, tracker, order, OrderState.COMMITTED, 0.0, blocks=3)
    outcomes.routed(F, NodeId("a"), True, 301.0)
    outcomes.sweep(301.0)
    assert _outcomes_of(outcomes, ActionKind.RETAIN)[0] == {"never_used": 1}


def test_policies_and_actions_are_counted_apart_and_records_are_dropped_when_decided():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    first = _issued(outcomes, tracker)
    other = tracker.submit(dataclasses.replace(first.spec, policy="oracle", order_id=""), 0.0)
    outcomes.issued(other, BPB)
    _move(outcomes, tracker, first, OrderState.CANCELLED, 1.0)
    _move(outcomes, tracker, other, OrderState.CANCELLED, 1.0)
    assert set(outcomes.stats()) == {("predictive", ActionKind.REPLICATE), ("oracle", ActionKind.REPLICATE)}
    assert outcomes._tracked == {} and outcomes._by_family == {}


def test_totals_are_kept_for_a_bounded_number_of_policy_names():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    for k in range(MAX_POLICIES + 5):
        order = tracker.submit(OrderSpec(F, [k + 1], NodeId("a"), NodeId("b"), 1000, policy=f"client-{k}"), 0.0)
        outcomes.issued(order, BPB)
    policies = {policy for policy, _ in outcomes.stats()}
    assert len(policies) == MAX_POLICIES + 1 and "other" in policies
    assert outcomes.stats()[("other", ActionKind.REPLICATE)].orders == 5


def test_an_order_that_expires_as_it_is_reported_gets_its_outcome_and_is_forgotten():
    core, clock = make_core(2)
    store(core, "n0", CHAIN)
    order = core.submit_order(OrderSpec(FAMILY, CHAIN, NodeId("n0"), NodeId("n1"), lease_ms=1000,
                                        policy="predictive", expected_benefit_ms=10.0))
    core.report_order(order.order_id, OrderState.IN_FLIGHT)
    clock.advance(2.0)  # no progress for longer than its lease
    with pytest.raises(FailedPrecondition):
        core.report_order(order.order_id, OrderState.COMMITTED)
    stats = core.action_outcomes()[("predictive", ActionKind.REPLICATE)]
    assert stats.outcomes["failed"] == 1 and sum(stats.outcomes.values()) == 1
    assert core._lifecycle.outcomes._tracked == {}


def _unread_replica(outcomes, tracker):
    """A replica committed at 1 s with a 10 s lease, closed unread at 12 s."""
    order = _issued(outcomes, tracker)
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.sweep(12.0)
    return order


@pytest.mark.parametrize("routes, read_after", [
    ([("b", True, 30.0)], 1),  # its family later found the copy on its node
    ([("b", False, 30.0), ("b", True, 40.0)], 0),  # the first route there found nothing: gone
    ([("a", True, 30.0)], 0),  # routed to the holder, never to the copy's node
    ([("b", True, 12.0 + 600.0 + 1.0)], 0),  # beyond AFTERLIFE_S: no longer followed
    ([], 0),
])
def test_a_copy_unread_in_its_lease_is_followed_to_the_first_request_on_its_node(routes, read_after):
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    _unread_replica(outcomes, tracker)
    for node, cached, when in routes:
        outcomes.sweep(when)
        outcomes.routed(F, NodeId(node), cached, when)
    counts, stats = _outcomes_of(outcomes)
    assert counts == {"never_used": 1}  # the outcome stays what the lease decided
    assert stats.read_after_lease == read_after
    assert stats.bytes_read_after_lease == read_after * 3 * BPB
    assert stats.to_json()["bytes_read_after_lease"] == read_after * 3 * BPB


def test_a_route_after_the_lease_but_before_the_sweep_decides_too():
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    order = _issued(outcomes, tracker)
    _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.routed(F, NodeId("b"), True, 11.5)  # lease ended at 11 s; not swept yet
    outcomes.routed(F, NodeId("b"), False, 11.6)  # the first route after the lease decides
    outcomes.sweep(20.0)
    counts, stats = _outcomes_of(outcomes)
    assert counts == {"never_used": 1} and stats.read_after_lease == 1


def test_orders_followed_after_their_lease_are_bounded(monkeypatch):
    monkeypatch.setattr(outcomes_module, "MAX_AFTERLIFE", 2)
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    for _ in range(3):
        _unread_replica(outcomes, tracker)
    assert len(outcomes._after) == 2  # the oldest went first
    outcomes.routed(F, NodeId("b"), True, 30.0)
    assert _outcomes_of(outcomes)[1].read_after_lease == 2
    assert not outcomes._after and not outcomes._after_by_family


def test_each_total_is_split_by_the_forecast_the_order_was_bought_for():
    """A burst-bought replica read in its lease, a return-bought one never read
    but found after it, and an operator's order: each forecast's share sums to the total."""
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    orders = {}
    for family, forecast in (("burst-fam", "burst"), ("conv-fam", "return"), ("op-fam", "")):
        order = tracker.submit(OrderSpec(Family(family), [1, 2], NodeId("a"), NodeId("b"), 10_000,
                                         expected_benefit_ms=20.0, policy="predictive", forecast=forecast), 0.0)
        outcomes.issued(order, BPB)
        orders[forecast] = _move(outcomes, tracker, order, OrderState.COMMITTED, 1.0)
    outcomes.routed(Family("burst-fam"), NodeId("b"), True, 2.0)
    outcomes.sweep(12.0)
    outcomes.routed(Family("conv-fam"), NodeId("b"), True, 30.0)
    stats = outcomes.stats()[("predictive", ActionKind.REPLICATE)]
    split = stats.by_forecast
    assert set(split) == {"burst", "return", ""}
    assert split["burst"].outcomes["used_in_time"] == 1 and split["burst"].bytes_used_in_time_share == 1.0
    assert split["return"].outcomes["never_used"] == 1 and split["return"].bytes_read_after_lease == 2 * BPB
    assert split["return"].bytes_read_after_lease_share == 1.0 and stats.bytes_read_after_lease_share == 1 / 3
    assert split[""].outcomes["never_used"] == 1 and split[""].read_after_lease == 0
    assert sum(s.orders for s in split.values()) == stats.orders == 3
    assert sum(s.bytes for s in split.values()) == stats.bytes == 6 * BPB
    assert stats.bytes_read_after_lease == 2 * BPB
    assert stats.to_json()["by_forecast"]["return"]["bytes_read_after_lease"] == 2 * BPB
    assert all(not s.by_forecast for s in split.values())  # one level only


_CLOSE_SEVEN = """
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.orders import OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.replication.outcomes import ActionOutcomes
outcomes, tracker = ActionOutcomes(), OrderTracker()
for benefit in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
    order = tracker.submit(OrderSpec(Family("conv"), [1, 2, 3], NodeId("a"), NodeId("b"), 10_000,
                                     expected_benefit_ms=benefit, policy="predictive"), 0.0)
    outcomes.issued(order, 1000)
    outcomes.transition(tracker.report(order.order_id, OrderState.COMMITTED, 1.0), 1.0)
outcomes.routed(Family("conv"), NodeId("b"), True, 2.0)  # closes all seven at once
print(repr(next(iter(outcomes.stats().values())).expected_ms_by_outcome["used_in_time"]))
"""


def test_orders_one_route_closes_add_up_in_issue_order_in_every_process():
    """The simulator is deterministic only if no sum depends on str hashing,
    which each process seeds anew (PYTHONHASHSEED): seven orders closed by one
    route add their expected ms in issue order, whatever the seed (as a set of
    OrderIds they did not, and the last digit of a simulate JSON moved between
    runs of the same code)."""
    import os
    import subprocess
    import sys

    in_issue_order = 0.0
    for benefit in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
        in_issue_order += benefit
    sums = {subprocess.run([sys.executable, "-c", _CLOSE_SEVEN], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in range(8)}
    assert sums == {repr(in_issue_order)}

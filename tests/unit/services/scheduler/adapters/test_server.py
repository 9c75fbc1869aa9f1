"""The scheduler's gauges of orders by outcome and of replicated bytes."""
from __future__ import annotations

from speckv.services.scheduler.adapters.server import (
    PENDING,
    action_bytes,
    action_bytes_by_forecast,
    action_bytes_read_after_lease,
    action_orders,
    replica_bytes,
)
from speckv.services.scheduler.orders import ActionKind
from speckv.services.scheduler.replication.outcomes import ActionStats, Outcome
from speckv.services.scheduler.replication.replicas import ReplicaStats


def _stats(orders: int, nbytes: int, decided: dict[Outcome, tuple[int, int]]) -> ActionStats:
    stats = ActionStats(orders=orders, bytes=nbytes)
    for outcome, (n, b) in decided.items():
        stats.outcomes[outcome.value] = n
        stats.bytes_by_outcome[outcome.value] = b
    return stats


def test_each_policy_and_action_splits_its_orders_and_bytes_by_outcome_with_the_rest_pending():
    stats = {("predictive", ActionKind.REPLICATE): _stats(5, 500, {Outcome.USED_IN_TIME: (2, 200),
                                                                   Outcome.NEVER_USED: (1, 100)}),
             ("predictive", ActionKind.RETAIN): _stats(1, 0, {})}
    orders = {(a["policy"], a["action"], a["outcome"]): v for v, a in action_orders(stats)}
    assert orders[("predictive", "replicate", "used_in_time")] == 2
    assert orders[("predictive", "replicate", "never_used")] == 1
    assert orders[("predictive", "replicate", PENDING)] == 2
    assert sum(v for (p, a, _), v in orders.items() if a == "replicate") == 5
    assert orders[("predictive", "retain", PENDING)] == 1
    assert {o for _, _, o in orders} == {o.value for o in Outcome} | {PENDING}
    nbytes = {(a["action"], a["outcome"]): v for v, a in action_bytes(stats)}
    assert (nbytes[("replicate", "used_in_time")], nbytes[("replicate", PENDING)]) == (200, 200)


def test_bytes_read_after_the_lease_per_policy_and_action():
    replicate = _stats(2, 200, {Outcome.NEVER_USED: (2, 200)})
    replicate.read_after_lease, replicate.bytes_read_after_lease = 1, 100
    stats = {("predictive", ActionKind.REPLICATE): replicate, ("predictive", ActionKind.RETAIN): _stats(1, 0, {})}
    assert action_bytes_read_after_lease(stats) == [(100.0, {"policy": "predictive", "action": "replicate"}),
                                                    (0.0, {"policy": "predictive", "action": "retain"})]


def test_bytes_are_split_by_the_forecast_the_orders_were_bought_for():
    replicate = _stats(3, 300, {Outcome.USED_IN_TIME: (1, 100), Outcome.NEVER_USED: (1, 100)})
    replicate.by_forecast = {"burst": _stats(1, 100, {Outcome.USED_IN_TIME: (1, 100)}),
                             "return": _stats(2, 200, {Outcome.NEVER_USED: (1, 100)})}
    points = {(a["forecast"], a["outcome"]): v for v, a in
              action_bytes_by_forecast({("predictive", ActionKind.REPLICATE): replicate})}
    assert points[("burst", "used_in_time")] == 100 and points[("burst", PENDING)] == 0
    assert points[("return", "never_used")] == 100 and points[("return", PENDING)] == 100
    assert sum(points.values()) == replicate.bytes


def test_no_orders_no_points():
    assert action_orders({}) == [] and action_bytes({}) == [] and action_bytes_read_after_lease({}) == []
    assert action_bytes_by_forecast({}) == []


def test_replica_bytes_are_replicated_and_wasted():
    stats = ReplicaStats(committed=3, released_unused=1, bytes_committed=3072, bytes_wasted=1024)
    assert replica_bytes(stats) == [(3072.0, {"kind": "replicated"}), (1024.0, {"kind": "wasted"})]

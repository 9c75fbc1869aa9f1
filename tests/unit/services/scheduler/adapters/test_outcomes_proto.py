"""ActionStats through speckv.v1.ActionOutcomeStats and back (outcomes_proto.py)."""
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.adapters.outcomes_proto import action_stats_from_proto, actions_to_proto
from speckv.services.scheduler.orders import ActionKind, OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.replication.outcomes import ActionOutcomes


def _outcomes() -> ActionOutcomes:
    """Replicas bought for a burst (read in time) and a return (never read,
    found after its lease), a prefetch that committed, one cancelled order."""
    outcomes, tracker = ActionOutcomes(), OrderTracker()

    def issue(family, action, forecast, target="b"):
        order = tracker.submit(OrderSpec(Family(family), [1, 2, 3], NodeId("a"), NodeId(target), 10_000,
                                         expected_benefit_ms=7.5, policy="predictive", action=action,
                                         forecast=forecast), 0.0)
        outcomes.issued(order, 100)
        return order

    for family, forecast in (("f1", "burst"), ("f2", "return")):
        outcomes.transition(tracker.report(issue(family, ActionKind.REPLICATE, forecast).order_id,
                                           OrderState.COMMITTED, 1.0), 1.0)
    prefetch = issue("f3", ActionKind.PREFETCH, "return", target="a")
    outcomes.transition(tracker.report(prefetch.order_id, OrderState.COMMITTED, 1.0, blocks_sent=2), 1.0)
    outcomes.transition(tracker.report(issue("f4", ActionKind.REPLICATE, "").order_id, OrderState.CANCELLED, 1.0),
                        1.0)
    outcomes.routed(Family("f1"), NodeId("b"), True, 2.0)
    outcomes.sweep(12.0)
    outcomes.routed(Family("f2"), NodeId("b"), True, 30.0)
    return outcomes


def test_every_figure_and_the_forecast_split_survive_the_round_trip():
    stats = _outcomes().stats()
    messages = actions_to_proto(stats)
    assert [(m.policy, m.action) for m in messages] == [("predictive", "prefetch"), ("predictive", "replicate")]
    replicate = messages[1]
    assert [(p.forecast, p.orders) for p in replicate.by_forecast] == [("", 1), ("burst", 1), ("return", 1)]
    assert replicate.bytes_read_after_lease == 300 and replicate.outcomes["cancelled"] == 1
    for message in messages:
        back = action_stats_from_proto(message)
        assert back.to_json() == stats[("predictive", ActionKind(message.action))].to_json()


def test_no_orders_no_messages():
    assert actions_to_proto({}) == []

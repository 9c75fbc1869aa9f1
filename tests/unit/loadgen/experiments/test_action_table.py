"""The per-action table of a comparison (action_table.py), from real outcome
accounting (services/scheduler/replication/outcomes.py)."""
import dataclasses

from speckv.loadgen.experiments.action_table import action_table
from speckv.loadgen.experiments.results import PolicySummary
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.orders import OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.replication.outcomes import ActionOutcomes

GIB = 2**30


def _summary(actions) -> PolicySummary:
    figures = {f.name: None for f in dataclasses.fields(PolicySummary)}
    return PolicySummary(**{**figures, "actions": actions})


def _replicas(read_in_time: int, read_after: int, unread: int, unread_forecast: str = "burst",
              running: int = 0) -> dict:
    """Replicas of one GiB each, committed at 1 s with a 10 s lease: some read
    in their lease, some only by a request on their node after it, the rest
    never; bought for burst forecasts, the unread ones for `unread_forecast`.
    `running` more carry a 100 s lease, still running when the totals are read."""
    outcomes, tracker = ActionOutcomes(), OrderTracker()
    decided = read_in_time + read_after + unread
    for i in range(decided + running):
        family = Family(f"f{i}")
        forecast = "burst" if i < read_in_time + read_after else unread_forecast
        lease_ms = 10_000 if i < decided else 100_000
        order = tracker.submit(OrderSpec(family, [i], NodeId("a"), NodeId("b"), lease_ms, expected_benefit_ms=1000.0,
                                         policy="predictive", forecast=forecast), 0.0)
        outcomes.issued(order, GIB)
        outcomes.transition(tracker.report(order.order_id, OrderState.COMMITTED, 1.0), 1.0)
        if i < read_in_time:
            outcomes.routed(family, NodeId("b"), True, 5.0)
    outcomes.sweep(12.0)
    for i in range(read_in_time, read_in_time + read_after):
        outcomes.routed(Family(f"f{i}"), NodeId("b"), True, 60.0)
    return {kind.value: stats.to_json() for (_, kind), stats in outcomes.stats().items()}


def test_the_table_reads_bytes_read_in_time_and_after_the_lease():
    table = action_table({"predictive": _summary(_replicas(read_in_time=2, read_after=1, unread=1))})
    header, _, row = table.splitlines()
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["orders"] == "4" and cells["GiB"] == "4.00"
    assert cells["used in time"] == "2" and cells["never used"] == "2" and cells["pending"] == "0"
    assert cells["bytes read in time"] == "0.500"
    assert cells["bytes read after lease"] == "0.250"
    assert cells["expected s (used in time)"] == "2.0"


def _cells(table: str) -> list[dict[str, str]]:
    header, _, *rows = table.splitlines()
    names = [c.strip() for c in header.split("|")]
    return [dict(zip(names, [c.strip() for c in row.split("|")])) for row in rows]


def test_an_action_bought_for_two_forecasts_gets_a_row_for_each_below_its_total():
    rows = _cells(action_table({"predictive": _summary(_replicas(2, 0, 2, unread_forecast="return"))}))
    assert [(r["forecast"], r["orders"], r["bytes read in time"]) for r in rows] == [
        ("burst, return", "4", "0.500"), ("burst", "2", "1.000"), ("return", "2", "0.000")]


def test_an_action_bought_for_one_forecast_names_it_in_one_row():
    rows = _cells(action_table({"predictive": _summary(_replicas(1, 0, 1))}))
    assert [(r["forecast"], r["orders"]) for r in rows] == [("burst", "2")]


def test_an_order_whose_lease_still_runs_is_pending_and_out_of_the_shares() -> None:
    """A live run reads the totals at its drain: a 100 s lease committed at 1 s
    has no outcome at 12 s; it is counted pending, not unread."""
    (row,) = _cells(action_table({"predictive": _summary(_replicas(1, 0, 1, running=1))}))
    assert (row["orders"], row["pending"], row["used in time"], row["never used"]) == ("3", "1", "1", "1")
    assert row["bytes read in time"] == "0.500"  # of the two decided orders' bytes


def test_no_orders_no_table():
    assert action_table({"none": _summary({})}) == ""

import pytest

from speckv.services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.replication.order_feed import OrderFeed
from speckv.services.scheduler.orders import OrderSpec, OrderState, OrderTracker

S = OrderState


def spec(**kw):
    base = dict(family=Family("f"), block_hashes=[1, 2], source=NodeId("a"), target=NodeId("b"), lease_ms=1000)
    base.update(kw)
    return OrderSpec(**base)


def test_lifecycle_and_counts():
    t = OrderTracker()
    o = t.submit(spec(), now=0.0)
    assert o.state is S.ISSUED and o.order_id
    assert t.report(o.order_id, S.IN_FLIGHT, now=0.5, bytes_sent=10).state is S.IN_FLIGHT
    assert t.report(o.order_id, S.COMMITTED, now=0.6, bytes_sent=20, blocks_sent=2).state is S.COMMITTED
    assert t.get(o.order_id).bytes_sent == 20
    counts = t.counts()
    assert counts[S.COMMITTED] == 1 and counts[S.ISSUED] == 0 and counts[S.IN_FLIGHT] == 0


@pytest.mark.parametrize("path", [
    [S.COMMITTED, S.IN_FLIGHT],
    [S.FAILED, S.COMMITTED],
    [S.CANCELLED, S.IN_FLIGHT],
    [S.ISSUED],
    [S.IN_FLIGHT, S.ISSUED],
])
def test_illegal_transitions(path):
    t = OrderTracker()
    o = t.submit(spec(), now=0.0)
    for state in path[:-1]:
        t.report(o.order_id, state, now=0.1)
    with pytest.raises(FailedPrecondition):
        t.report(o.order_id, path[-1], now=0.1)


def test_repeated_terminal_report_is_idempotent():
    t = OrderTracker()
    o = t.submit(spec(), now=0.0)
    t.report(o.order_id, S.COMMITTED, now=0.1)
    assert t.report(o.order_id, S.COMMITTED, now=0.2).state is S.COMMITTED
    assert t.counts()[S.COMMITTED] == 1


def test_lease_expiry_and_progress_refresh():
    t = OrderTracker()
    o = t.submit(spec(lease_ms=1000), now=0.0)
    assert t.sweep(0.9) == []
    t.report(o.order_id, S.IN_FLIGHT, now=0.9)  # progress pushes the lease to 1.9
    assert t.sweep(1.5) == []
    assert [x.order_id for x in t.sweep(2.0)] == [o.order_id]
    assert t.get(o.order_id).state is S.EXPIRED
    with pytest.raises(FailedPrecondition):
        t.report(o.order_id, S.COMMITTED, now=2.1)


def test_report_after_lease_without_sweep_is_expired():
    t = OrderTracker()
    o = t.submit(spec(lease_ms=100), now=0.0)
    with pytest.raises(FailedPrecondition, match="EXPIRED"):
        t.report(o.order_id, S.IN_FLIGHT, now=0.5)


@pytest.mark.parametrize("kw,match", [
    (dict(source=NodeId("")), "source"),
    (dict(target=NodeId("")), "target"),
    (dict(target=NodeId("a")), "source_node == order.target_node"),
    (dict(block_hashes=[]), "empty"),
    (dict(block_hashes=[1, 1]), "repeats"),
    (dict(lease_ms=0), "lease"),
])
def test_submit_validates(kw, match):
    with pytest.raises(InvalidArgument, match=match):
        OrderTracker().submit(spec(**kw), now=0.0)


def test_ids_unknown_and_duplicates():
    t = OrderTracker()
    a, b = t.submit(spec(), 0.0), t.submit(spec(), 0.0)
    assert a.order_id != b.order_id
    assert t.submit(spec(order_id="mine"), 0.0).order_id == "mine"
    with pytest.raises(AlreadyExists):
        t.submit(spec(order_id="mine"), 0.0)
    with pytest.raises(NotFound):
        t.report("nope", S.COMMITTED, 0.0)
    with pytest.raises(InvalidArgument):
        t.get("")


def test_retention_is_bounded():
    t = OrderTracker(max_retained=2)
    ids = []
    for _ in range(3):
        o = t.submit(spec(), 0.0)
        t.report(o.order_id, S.FAILED, 0.0)
        ids.append(o.order_id)
    with pytest.raises(NotFound):
        t.get(ids[0])
    assert t.get(ids[2]).state is S.FAILED and t.counts()[S.FAILED] == 3


def test_feed_filters_by_source_and_closes():
    t = OrderTracker()
    feed = OrderFeed(capacity=4)
    wa, wall = feed.watch(NodeId("a")), feed.watch(None)
    o1 = t.submit(spec(), 0.0)
    o2 = t.submit(spec(source=NodeId("c")), 0.0)
    assert feed.publish(o1) == 2 and feed.publish(o2) == 1
    assert wa.next(0.01).order_id == o1.order_id and wa.next(0.01) is None
    assert [wall.next(0.01).order_id for _ in range(2)] == [o1.order_id, o2.order_id]
    feed.close_all()
    assert wa.closed and wa.next(0.01) is None
    assert feed.watch(None).closed  # watching after close ends at once


def test_feed_overflow_closes_slow_watcher():
    feed = OrderFeed(capacity=2)
    w = feed.watch(None)
    t = OrderTracker()
    for _ in range(3):
        feed.publish(t.submit(spec(), 0.0))
    assert w.overflowed and w.closed
    assert feed.publish(t.submit(spec(), 0.0)) == 0

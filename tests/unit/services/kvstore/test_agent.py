from __future__ import annotations

from speckv.services.kvstore.agent import CancelledOrders


def test_cancelled_orders_are_remembered_up_to_capacity():
    cancelled = CancelledOrders(capacity=2)
    for order_id in ("o-1", "o-2", "o-3"):
        cancelled.mark(order_id)
    assert not cancelled.contains("o-1")  # the oldest is forgotten first
    assert cancelled.contains("o-2") and cancelled.contains("o-3")
    assert not cancelled.contains("o-4")


def test_marking_again_refreshes_an_id():
    cancelled = CancelledOrders(capacity=2)
    cancelled.mark("o-1")
    cancelled.mark("o-2")
    cancelled.mark("o-1")
    cancelled.mark("o-3")
    assert cancelled.contains("o-1") and not cancelled.contains("o-2")

"""The simulator's event core: time order, tie order, a clock that never goes back."""
from __future__ import annotations

import random

import pytest

from speckv.loadgen.sim.event_loop import EventQueue, VirtualClock


def test_events_run_in_time_order_and_the_clock_never_goes_back():
    q = EventQueue(VirtualClock(5.0))
    rng = random.Random(3)
    seen: list[float] = []

    def record(t: float) -> None:
        assert q.now() == t  # a callback sees its own time
        seen.append(q.now())
        if len(seen) < 300:  # callbacks schedule more, never in the past
            q.after(rng.choice([0.0, rng.random()]), lambda t2=q.now() + 0.0: None)

    for t in (rng.uniform(5, 50) for _ in range(200)):
        q.at(t, lambda t=t: record(t))
    q.run()
    assert len(seen) == 200
    assert seen == sorted(seen)
    assert q.now() >= seen[-1]


def test_ties_run_by_priority_then_in_scheduling_order():
    q = EventQueue()
    order: list[str] = []
    q.at(1.0, lambda: order.append("b0"), priority=1)
    q.at(1.0, lambda: order.append("a0"))
    q.at(1.0, lambda: order.append("a1"))
    q.at(1.0, lambda: order.append("b1"), priority=1)
    q.at(0.5, lambda: order.append("early"), priority=9)
    q.run()
    assert order == ["early", "a0", "a1", "b0", "b1"]


def test_cancelled_events_are_skipped_and_the_past_cannot_be_scheduled():
    q = EventQueue()
    ran: list[int] = []
    h = q.at(2.0, lambda: ran.append(2))
    q.at(1.0, lambda: ran.append(1))
    h.cancel()
    q.run()
    assert ran == [1] and q.processed == 1
    with pytest.raises(ValueError):
        q.at(0.5, lambda: None)
    with pytest.raises(ValueError):
        q.clock._move_to(0.0)


def test_run_stops_at_until_and_on_the_stop_predicate():
    q = EventQueue()
    ran: list[float] = []
    for t in (1.0, 2.0, 3.0, 4.0):
        q.at(t, lambda t=t: ran.append(t))
    q.run(until_s=2.5)
    assert ran == [1.0, 2.0] and q.now() == 2.0
    q.run(stop=lambda: len(ran) >= 3)
    assert ran == [1.0, 2.0, 3.0]
    q.run()
    assert ran == [1.0, 2.0, 3.0, 4.0]

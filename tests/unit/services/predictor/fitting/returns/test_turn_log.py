"""TurnLog (fitting/returns/turn_log.py): the traffic online learning reads,
as turn records, bounded by its window and its turn-end cap."""
from __future__ import annotations

import pytest

from speckv.services.predictor.fitting.returns.turn_log import TurnLog


def test_a_turn_returns_at_its_conversations_next_arrival_whether_or_not_that_turn_ended():
    log = TurnLog(window_s=1000.0, max_turn_ends=100)
    log.arrival("a", 0.0, 100)
    log.turn_end("a", 5.0, 0.0, 100, 10)
    log.arrival("a", 40.0, 200)  # still in flight
    log.arrival("b", 1.0, 50)
    log.turn_end("b", 3.0, 1.0, 50, 5)
    turns = {t.conversation: t for t in log.turns()}
    assert turns["a"].next_arrival_s == 40.0 and turns["a"].turn_index == 0
    assert turns["b"].next_arrival_s is None
    assert log.arrivals_without_end() == [("a", 40.0, 200)]
    log.turn_end("a", 50.0, 40.0, 200, 10)
    second = [t for t in log.turns() if t.arrival_s == 40.0][0]
    assert second.turn_index == 1 and second.end_s == 50.0


def test_a_repeated_arrival_is_one_arrival_and_an_end_without_its_arrival_adds_it():
    log = TurnLog(window_s=1000.0, max_turn_ends=100)
    log.arrival("a", 0.0)
    log.arrival("a", 0.0)
    log.turn_end("b", 9.0, 2.0, 10, 1)
    assert log.arrivals_total == 2 and [t.conversation for t in log.turns()] == ["b"]


def test_the_window_and_the_turn_end_cap_bound_what_is_held():
    log = TurnLog(window_s=100.0, max_turn_ends=50)
    for i in range(400):
        log.arrival(f"c{i}", float(i), 10)
        log.turn_end(f"c{i}", i + 0.5, float(i), 10, 1)
    assert len(log) <= 50
    log.prune()
    assert all(t.end_s >= log.newest_s - 100.0 for t in log.turns())
    assert len(log.arrivals_without_end()) == 0
    assert log.turn_ends_total == 400


@pytest.mark.parametrize("window_s, cap", [(0.0, 1), (10.0, 0), (float("inf"), 5)])
def test_bad_bounds_are_refused(window_s, cap):
    with pytest.raises(ValueError):
        TurnLog(window_s, cap)

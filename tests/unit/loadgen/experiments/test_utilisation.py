"""Utilisation figures on hand-built records with known busy, idle and overloaded seconds."""
import math

import pytest

from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.utilisation import time_per_second, utilisation

TARGET_MS = 1000.0


def rec(node: str, arrival: float, e2e_s: float, queue_s: float = 0.0, fetch_s: float = 0.0) -> RequestRecord:
    return RequestRecord(f"{node}-{arrival}", arrival, "f", 100, 10, node_id=node, ttft_ms=1.0,
                         e2e_ms=e2e_s * 1e3, queue_ms=queue_s * 1e3, fetch_ms=fetch_s * 1e3)


@pytest.mark.parametrize("intervals,expected", [
    ([], [0, 0, 0]),
    ([(0.0, 3.0)], [1, 1, 1]),
    ([(0.5, 1.5)], [0.5, 0.5, 0]),
    ([(0.2, 0.4), (0.3, 0.6), (2.0, 2.25)], [0.4, 0, 0.25]),
    ([(-5.0, 0.5), (2.9, 10.0)], [0.5, 0, 0.1]),
])
def test_time_per_second_covers_the_union(intervals, expected):
    assert time_per_second(intervals, 0, 3) == pytest.approx(expected)


def test_a_node_idle_beside_an_overloaded_one_counts_its_idle_seconds():
    # a is busy 0-10 s with one request that queued 4 s (3 s past the 1 s target: seconds 1, 2, 3
    # overloaded); b serves one request in 8-10 s, so it idles through the overload.
    records = [rec("a", 0.0, 10.0, queue_s=4.0), rec("b", 8.0, 2.0)]
    u = utilisation(records, TARGET_MS, ["a", "b"])
    assert u.seconds == 10 and u.node_seconds == 20
    # b idles in seconds 1, 2 and 3 (three node-seconds), while a is overloaded; a is never idle.
    assert u.overload_idle_share == pytest.approx(3 / 20)
    # seconds 0-7: fractions (1, 0): cv 1; seconds 8-9: (1, 1): cv 0.
    assert u.busy_cv == pytest.approx(8 / 10)


def test_even_load_without_queues_scores_zero():
    records = [rec(n, 0.0, 5.0) for n in "abcd"]
    u = utilisation(records, TARGET_MS, list("abcd"))
    assert u.overload_idle_share == 0 and u.busy_cv == 0


def test_a_node_that_served_nothing_still_idles_and_a_dead_one_does_not():
    records = [rec("a", 0.0, 4.0, queue_s=3.0)]  # overloaded in seconds 1 and 2
    assert utilisation(records, TARGET_MS, ["a", "b"]).overload_idle_share == pytest.approx(2 / 8)
    dead_from_1 = utilisation(records, TARGET_MS, ["a", "b"], {"b": (-math.inf, 1.0)})
    assert dead_from_1.overload_idle_share == 0 and dead_from_1.node_seconds == 5


def test_the_busy_span_starts_after_the_pull():
    records = [rec("a", 0.0, 2.0, fetch_s=1.0), rec("b", 0.0, 2.0)]
    # second 0: fractions (0, 1), cv 1; second 1: (1, 1), cv 0
    assert utilisation(records, TARGET_MS, ["a", "b"]).busy_cv == pytest.approx(0.5)


def test_no_served_records_give_no_figures():
    u = utilisation([RequestRecord("x", 0.0, "f", 1, 1, error="boom")], TARGET_MS, ["a"])
    assert u.overload_idle_share is None and u.busy_cv is None

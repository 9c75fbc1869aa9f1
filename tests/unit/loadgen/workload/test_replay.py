"""Replay honours arrival times (on an injected clock) and never waits for responses."""
from __future__ import annotations

import pytest

from speckv.loadgen.workload.replay import TimeMap, replay_open_loop
from speckv.services.common.clock import ManualClock
from speckv.services.common.traces import TraceRequest


class ManualWaiter:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def wait_until(self, t: float) -> None:
        if t > self.clock.now():
            self.clock.set(t)


def _request(t: float) -> TraceRequest:
    return TraceRequest(t, 1000, 10, (1, 2), 512, "1")


def test_requests_are_sent_at_their_compressed_arrival_times():
    clock = ManualClock(100.0)
    times = TimeMap(origin=100.0, start_s=50.0, speed=4.0)
    sent = []
    requests = [_request(t) for t in (50.0, 50.0, 52.0, 58.5, 90.0)]
    count = replay_open_loop(requests, times, ManualWaiter(clock), lambda i, r: sent.append((i, clock.now())))
    assert count == 5
    assert sent == [(0, 100.0), (1, 100.0), (2, 100.5), (3, pytest.approx(102.125)), (4, 110.0)]


def test_a_slow_send_does_not_shift_later_arrivals():
    clock = ManualClock(0.0)
    times = TimeMap(origin=0.0, start_s=0.0, speed=1.0)
    sent = []

    def slow_send(i, r):
        sent.append(clock.now())
        clock.advance(0.3)  # a send that overran (it should not, but lateness must not compound)

    replay_open_loop([_request(t) for t in (0.0, 1.0, 1.1, 3.0)], times, ManualWaiter(clock), slow_send)
    assert sent == [0.0, 1.0, pytest.approx(1.3), 3.0]


def test_time_map_round_trips():
    times = TimeMap(origin=1000.0, start_s=600.0, speed=2.0)
    assert times.to_clock(610.0) == 1005.0
    assert times.to_trace(times.to_clock(612.5)) == pytest.approx(612.5)


def test_stop_ends_the_replay_early():
    clock = ManualClock(0.0)
    sent = []
    replay_open_loop([_request(t) for t in range(10)], TimeMap(0.0, 0.0, 1.0), ManualWaiter(clock),
                     lambda i, r: sent.append(i), should_stop=lambda: len(sent) >= 3)
    assert sent == [0, 1, 2]

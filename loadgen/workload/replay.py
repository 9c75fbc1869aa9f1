"""Open-loop trace replay: each request is sent at its arrival time, never
waiting for responses.

A slice [start_s, start_s + duration_s) of trace time is replayed `speed`
times faster: the request arriving at trace time t is sent when the clock
reads origin + (t - start_s) / speed. `send` must hand the request off and
return at once (the live router queues it on a worker pool), so one slow
request never delays the next. The clock and the wait are injected: the
real clock with a sleep here, a manual clock in tests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from speckv.services.common.clock import Clock
from speckv.services.common.traces import TraceRequest


class Waiter(Protocol):
    def wait_until(self, t: float) -> None:
        """Returns once the clock reads at least t (or at once if it does)."""
        ...


class SleepWaiter:
    """Waits on a real clock by sleeping (short naps, so a late wake-up never
    compounds)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def wait_until(self, t: float) -> None:
        while (left := t - self._clock.now()) > 0:
            time.sleep(min(left, 0.05))


@dataclass(frozen=True, slots=True)
class TimeMap:
    """Trace time <-> replay clock: clock = origin + (trace - start_s) / speed."""

    origin: float
    start_s: float
    speed: float

    def to_clock(self, trace_s: float) -> float:
        return self.origin + (trace_s - self.start_s) / self.speed

    def to_trace(self, clock_s: float) -> float:
        return self.start_s + (clock_s - self.origin) * self.speed


def replay_open_loop(requests: Sequence[TraceRequest], times: TimeMap, waiter: Waiter,
                     send: Callable[[int, TraceRequest], None],
                     should_stop: Callable[[], bool] = lambda: False) -> int:
    """Sends requests (sorted by arrival) at their mapped times; returns how many were sent."""
    sent = 0
    for index, request in enumerate(requests):
        if should_stop():
            break
        waiter.wait_until(times.to_clock(request.arrival_s))
        send(index, request)
        sent += 1
    return sent

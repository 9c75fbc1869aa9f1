"""Event core: a virtual clock and a heap-ordered event queue.

Algorithm: a binary heap of (time_s, priority, seq, callback). `run` pops
the earliest entry, moves the clock to its time and calls it; a callback
may schedule more events, never before the current time. Ties at one time
run by `priority` (lower first), then in scheduling order (seq), so a run is
deterministic. Cancelling is lazy: a cancelled handle's entry is skipped
when popped (cheaper than removing from the middle of a heap).

Why a hand-written heap and not SimPy: the simulator needs only timed
callbacks (no processes, resources or interrupts), and a heapq loop costs a
fraction of what SimPy's generator-based processes cost per event; at
hundreds of nodes and hours of trace the loop is the hot path.

Invariants: the clock never goes back; events run in (time, priority, seq)
order; `now()` inside a callback is that event's time. Times are seconds.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable

Callback = Callable[[], None]


class VirtualClock:
    """The simulation's clock: a `Clock` (services.common.clock) that only
    the event queue moves."""

    __slots__ = ("_now",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def _move_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual time cannot go back ({t} < {self._now})")
        self._now = t


@dataclass(slots=True)
class EventHandle:
    """A scheduled event; `cancel()` makes the queue skip it."""

    time_s: float
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(slots=True)
class EventQueue:
    clock: VirtualClock = field(default_factory=VirtualClock)
    processed: int = 0  # events run so far (cancelled ones not counted)
    _heap: list = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    def now(self) -> float:
        return self.clock.now()

    def at(self, time_s: float, callback: Callback, priority: int = 0) -> EventHandle:
        """Schedules callback at time_s (>= now)."""
        if time_s < self.clock.now():
            raise ValueError(f"cannot schedule at {time_s} before now ({self.clock.now()})")
        handle = EventHandle(time_s)
        heapq.heappush(self._heap, (time_s, priority, next(self._seq), callback, handle))
        return handle

    def after(self, delay_s: float, callback: Callback, priority: int = 0) -> EventHandle:
        return self.at(self.clock.now() + max(0.0, delay_s), callback, priority)

    def __len__(self) -> int:
        return len(self._heap)

    def next_time(self) -> float | None:
        while self._heap and self._heap[0][4].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def run(self, until_s: float = float("inf"), stop: Callable[[], bool] | None = None) -> int:
        """Runs events with time <= until_s (all of them by default), or
        until stop() is true after an event; returns how many ran."""
        ran = 0
        heap, clock = self._heap, self.clock
        while heap and heap[0][0] <= until_s:
            time_s, _, _, callback, handle = heapq.heappop(heap)
            if handle.cancelled:
                continue
            clock._move_to(time_s)
            callback()
            ran += 1
            if stop is not None and stop():
                break
        self.processed += ran
        return ran

"""Injectable clocks: the same cores run on the real clock and in virtual time.

All times are float seconds. `now()` is monotonic within one clock object; it
is the only notion of time a core may use.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary, fixed origin; never decreases."""
        ...


class SystemClock:
    """Wall-anchored monotonic clock: starts at the Unix time it was created at
    and then advances with time.monotonic(), so it never jumps backwards."""

    __slots__ = ("_origin_wall", "_origin_mono")

    def __init__(self) -> None:
        self._origin_wall = time.time()
        self._origin_mono = time.monotonic()

    def now(self) -> float:
        return self._origin_wall + (time.monotonic() - self._origin_mono)


class ManualClock:
    """A clock that moves only when told to (tests and simulation)."""

    __slots__ = ("_now", "_lock")

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back (advance by {seconds})")
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, t: float) -> None:
        with self._lock:
            if t < self._now:
                raise ValueError(f"a clock cannot go back ({t} < {self._now})")
            self._now = t

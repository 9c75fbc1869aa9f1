"""Circuit breaker in front of the scheduler's Route: when to ask it, when not.

Algorithm (a three-state breaker, counted in calls, timed on an injected clock):

- CLOSED: every route asks the scheduler. `failures_to_open` consecutive
  failures (default 3; an error that says the scheduler is unwell, or a
  missed deadline) open it. A success resets the count.
- OPEN: no route asks the scheduler; the fallback answers each at once, so a
  dead scheduler costs the request path nothing. After `open_s` (default
  1.0 s) the breaker half-opens.
- HALF_OPEN: one route at a time is let through as a probe; every other
  route meanwhile uses the fallback. The probe's success closes the
  breaker (routing returns to the scheduler); its failure opens it again
  for another `open_s`. A probe that never reports back (its caller died)
  is presumed lost after `open_s`, and the next route probes again.

So a scheduler that is down costs at most one call per `open_s`, and one
that is back takes routing back within `open_s` plus one call. Thread-safe:
routes come from many request threads at once.
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

from speckv.services.common.clock import Clock
from speckv.services.common.errors import require


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    """failures_to_open: consecutive failures that open a closed breaker (>= 1);
    open_s: seconds an open breaker waits before it lets a probe through (> 0)."""

    failures_to_open: int = 3
    open_s: float = 1.0

    def __post_init__(self) -> None:
        require(self.failures_to_open >= 1, f"failures_to_open must be >= 1, not {self.failures_to_open}")
        require(self.open_s > 0, f"open_s must be > 0, not {self.open_s}")


class CircuitBreaker:
    """The breaker of the module docstring. allow() says whether this call
    may ask the scheduler (in HALF_OPEN it claims the one probe); the caller
    then reports the call's outcome with record_success() or record_failure()."""

    __slots__ = ("_settings", "_clock", "_lock", "_state", "_failures", "_opened_at", "_probe_at", "_opens")

    def __init__(self, settings: BreakerSettings, clock: Clock) -> None:
        self._settings, self._clock = settings, clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0  # consecutive, while CLOSED
        self._opened_at = 0.0  # clock s when it last opened
        self._probe_at: float | None = None  # clock s the probe in flight was let through; None: no probe out
        self._opens = 0  # times it opened, ever

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._half_open_if_due()
            return self._state

    @property
    def opens(self) -> int:
        """How many times the breaker has opened (CLOSED or HALF_OPEN -> OPEN)."""
        with self._lock:
            return self._opens

    def allow(self) -> bool:
        with self._lock:
            self._half_open_if_due()
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.OPEN:
                return False
            now = self._clock.now()
            if self._probe_at is not None and now - self._probe_at < self._settings.open_s:
                return False  # a probe is out: everyone else falls back until it answers
            self._probe_at = now
            return True

    def record_success(self) -> None:
        with self._lock:
            self._state, self._failures, self._probe_at = BreakerState.CLOSED, 0, None

    def record_failure(self) -> None:
        with self._lock:
            if self._state is BreakerState.CLOSED:
                self._failures += 1
                if self._failures >= self._settings.failures_to_open:
                    self._open()
            elif self._state is BreakerState.HALF_OPEN:
                self._open()
            # OPEN: a late failure of a call let through before it opened changes nothing

    def _open(self) -> None:
        self._state, self._failures, self._probe_at = BreakerState.OPEN, 0, None
        self._opened_at = self._clock.now()
        self._opens += 1

    def _half_open_if_due(self) -> None:
        if self._state is BreakerState.OPEN and self._clock.now() - self._opened_at >= self._settings.open_s:
            self._state, self._probe_at = BreakerState.HALF_OPEN, None

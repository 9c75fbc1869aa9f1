"""Where the planner's foresight comes from, behind two small interfaces.

- ForecastSource: per family, how many requests are expected in
  (now, now + horizon]. The live `predictive` policy reads the predictor
  service (remote.PredictorForecasts); the simulator plugs an in-process
  predictor in; `oracle` reads the truth (FutureForecasts below).
- FutureArrivals: the true arrival counts in a window, read from a trace.
  TraceFutureArrivals maps scheduler time t to trace time t - time_offset_s,
  so a replay that started the trace at scheduler time T uses offset T.

Sources are called from a policy's prepare(), outside the scheduler lock;
they may block on I/O there but must not raise for a transient outage: they
return [] and the planner simply plans nothing new that tick.
"""
from __future__ import annotations

import bisect
import enum
from collections import Counter
from dataclasses import dataclass
from typing import Protocol, Sequence

from speckv.services.common.ids import Family
from speckv.services.common.traces.records import TraceRequest


class ForecastKind(enum.Enum):
    """BURST: a family's arrival count (the predictor's count model, or the
    truth); RETURN: P(a conversation's next turn comes within the horizon)
    from the session-return model, as a count below one, over an action's
    useful life (the replica lease); RETENTION: the same over the retain
    action's much longer window (retain.ttl_s), priced by the retain step
    only (retention_plan.py)."""

    BURST = "burst"
    RETURN = "return"
    RETENTION = "retention"


@dataclass(frozen=True, slots=True)
class Forecast:
    family: Family
    horizon_s: float
    expected_count: float  # arrivals expected in (now, now + horizon]
    upper_quantile: float  # a high quantile of that count (== expected for the truth)
    burst_probability: float
    kind: ForecastKind = ForecastKind.BURST
    # RETENTION only, optional: (t s, P(the next request comes within t)),
    # t and P nondecreasing, t <= horizon_s; read as a step (P at the largest
    # t <= the time asked, 0 before the first point). Empty: unknown.
    curve: tuple[tuple[float, float], ...] = ()


def p_within(curve: Sequence[tuple[float, float]], t: float) -> float:
    """P(within t) of a Forecast.curve, read as a step (see Forecast)."""
    p = 0.0
    for at, value in curve:
        if at > t:
            break
        p = value
    return p


class ForecastSource(Protocol):
    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        """The top max_families families by expected count; [] when unavailable."""
        ...


class CombinedForecasts:
    """Several sources as one (e.g. family bursts and session returns): every
    source's forecasts, in order; the planner keeps a family's larger count."""

    def __init__(self, sources: Sequence[ForecastSource]) -> None:
        self._sources = list(sources)

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        out: list[Forecast] = []
        for source in self._sources:
            out.extend(source.forecast(now, horizon_s, max_families))
        return out


class FutureArrivals(Protocol):
    def counts(self, start: float, end: float) -> dict[Family, int]:
        """True arrivals per family in (start, end], scheduler seconds."""
        ...

    def first_arrivals(self, start: float, end: float) -> dict[Family, float]:
        """Each family's first arrival in (start, end], scheduler seconds."""
        ...


class TraceFutureArrivals:
    """The future as a trace says it will be (the oracle's input)."""

    def __init__(self, requests: Sequence[TraceRequest], time_offset_s: float = 0.0) -> None:
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        self._times = [r.arrival_s for r in ordered]
        self._families = [Family(r.family) for r in ordered]
        self._offset = time_offset_s

    def counts(self, start: float, end: float) -> dict[Family, int]:
        lo = bisect.bisect_right(self._times, start - self._offset)
        hi = bisect.bisect_right(self._times, end - self._offset)
        return dict(Counter(self._families[lo:hi]))

    def first_arrivals(self, start: float, end: float) -> dict[Family, float]:
        lo = bisect.bisect_right(self._times, start - self._offset)
        hi = bisect.bisect_right(self._times, end - self._offset)
        first: dict[Family, float] = {}
        for t, family in zip(self._times[lo:hi], self._families[lo:hi]):
            first.setdefault(family, t + self._offset)
        return first

    def __len__(self) -> int:
        return len(self._times)


class FutureForecasts:
    """A ForecastSource that knows the future exactly (oracle): the true
    counts within the horizon asked for, or within window_s when given."""

    def __init__(self, future: FutureArrivals, window_s: float | None = None,
                 kind: ForecastKind = ForecastKind.BURST, max_families: int | None = None,
                 curve: bool = False) -> None:
        self._future = future
        self._window_s = window_s
        self._kind = kind
        self._max_families = max_families  # overrides the caller's (the retain step prices more)
        self._curve = curve and kind is ForecastKind.RETENTION  # the true next arrival as the curve

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        horizon_s = self._window_s if self._window_s is not None else horizon_s
        counts = self._future.counts(now, now + horizon_s)
        limit = self._max_families if self._max_families is not None else max_families
        top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]
        if not self._curve:
            return [Forecast(family, horizon_s, float(n), float(n), 1.0, self._kind) for family, n in top]
        # The truth of "when": P(within t) steps from 0 to 1 at the first arrival.
        first = self._future.first_arrivals(now, now + horizon_s)
        return [Forecast(family, horizon_s, float(n), float(n), 1.0, self._kind, ((first[family] - now, 1.0),))
                for family, n in top]

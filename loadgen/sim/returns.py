"""Session-return foresight in the simulator: the return model trained on
trace time before the slice, the online ReturnTracker it serves, and the
ForecastSource that hands the planner each open conversation's chance of
coming back within an action's useful life.

Training (train_returns): the turns of the requests before the slice
(services/predictor/fitting/returns/turns.py, the configured service model for
their ends), their feature rows from the one online builder, one LightGBM
classifier per horizon with labels censored at the slice's start
(services/config/predictor.json, `session_return`); never a row of the
slice. Too little history (fewer than MIN_TRAINING_TURNS turns) trains
nothing: the run's notes say so and `predictive` plans on bursts alone.

Serving: the Simulation feeds the tracker every arrival and every turn end
(the engine's real completion time), and ReturnForecasts turns its open
conversations into Forecasts: count = P(the next turn comes within window_s
of now | not yet), window_s = the replica lease (the time an action made
now stays useful), the `max_families` likeliest first, recomputed at most
every refresh_s of simulated time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from speckv.services.common.ids import Family
from speckv.services.common.traces import TraceRequest
from speckv.services.predictor.fitting.returns.config import ReturnConfig, load_return_config
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.model_training import train_return_model
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.serving.returns.model import ReturnModel
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from speckv.services.scheduler.forecasts import Forecast, ForecastKind

MIN_TRAINING_TURNS = 500


@dataclass(frozen=True, slots=True)
class TrainedReturns:
    """The return model every simulation of a run serves (picklable)."""

    model: ReturnModel
    config: ReturnConfig
    description: str

    def tracker(self) -> ReturnTracker:
        limits = self.config.tracker
        return ReturnTracker(self.model, self.config.features, limits.max_open_conversations, limits.max_idle_s,
                             self.config.recalibration)


def train_returns(history: Sequence[TraceRequest], until_s: float, source: str = "the trace") -> TrainedReturns | None:
    """The return model on history (requests before until_s), or None when
    it holds fewer than MIN_TRAINING_TURNS turns."""
    config = load_return_config()
    turns = build_turns([r for r in history if r.arrival_s < until_s], config.service)
    if len(turns) < MIN_TRAINING_TURNS:
        return None
    rows = build_rows(turns, config.features)
    model = train_return_model(rows, config.horizons_s, until_s, config.lightgbm, config.validation_fraction)
    return TrainedReturns(model, config, f"session-return LightGBM trained on {len(turns)} turns of {source} "
                                         f"before {until_s:.0f} s (labels censored there)")


def warm(tracker: "ReturnTracker | TurnSink", history: Sequence[TraceRequest], until_s: float, config: ReturnConfig) -> None:
    """Feeds the tracker the arrivals and modelled turn ends of history
    before until_s, in time order (the slice then feeds it live)."""
    events: list[tuple[float, int, TraceRequest]] = []
    for r in history:
        if r.arrival_s >= until_s:
            continue
        events.append((r.arrival_s, 0, r))
        end = r.arrival_s + config.service(r.prompt_tokens, r.output_tokens)
        if end < until_s:
            events.append((end, 1, r))
    events.sort(key=lambda e: (e[0], e[1]))
    for t, kind, r in events:
        if kind == 0:
            tracker.arrival(r.family, t, r.prompt_tokens)
        else:
            tracker.turn_end(r.family, t, r.arrival_s, r.prompt_tokens, r.output_tokens, float(r.follow_ups))


class TrackerSlot:
    """The tracker a ReturnForecasts reads; None until a return model is
    served (online learning's cold start, online_returns.py): no forecasts."""

    __slots__ = ("tracker",)

    def __init__(self, tracker: ReturnTracker | None = None) -> None:
        self.tracker = tracker


class TurnSink(Protocol):
    """What warm feeds: a ReturnTracker, or online_returns.SimReturns."""

    def arrival(self, conversation: str, now: float, prompt_tokens: int = 0) -> None: ...

    def turn_end(self, conversation: str, now: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 follow_ups: float = 0.0) -> bool | None: ...


CURVE_POINTS = 10  # P(within t) at t = window x k / 10: the retain step's curve (coarse is conservative)


class ReturnForecasts:
    """A ForecastSource over a ReturnTracker (see the module docstring).
    kind RETENTION serves the retain step over its own window (retain.ttl_s)
    and family count (max_families, overriding the caller's), each forecast
    with its survival curve at CURVE_POINTS times (Forecast.curve) when
    curve is set (retain.pricing "curve")."""

    def __init__(self, tracker: ReturnTracker | TrackerSlot, window_s: float, refresh_s: float = 1.0,
                 kind: ForecastKind = ForecastKind.RETURN, max_families: int | None = None,
                 curve: bool = False) -> None:
        self._slot = tracker if isinstance(tracker, TrackerSlot) else TrackerSlot(tracker)
        self._window_s = window_s
        self._refresh_s = refresh_s
        self._kind = kind
        self._max_families = max_families
        self._with_curve = curve and kind is ForecastKind.RETENTION
        self._at: float | None = None
        self._cached: list[Forecast] = []

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        if self._at is not None and now - self._at < self._refresh_s:
            return self._cached
        tracker = self._slot.tracker
        if tracker is None:
            return []
        limit = self._max_families if self._max_families is not None else max_families
        times = [self._window_s * k / CURVE_POINTS for k in range(1, CURVE_POINTS + 1)]
        if self._with_curve:
            conversations, grid = tracker.p_within_grid(now, times)
        else:
            conversations, p_window = tracker.p_within(now, self._window_s)
            grid = p_window.reshape(-1, 1)
        p = grid[:, -1]
        top = np.argsort(-p, kind="stable")[:limit] if len(p) else np.zeros(0, dtype=np.int64)
        self._cached = [Forecast(Family(conversations[i]), self._window_s, float(p[i]), float(p[i]), 1.0,
                                 self._kind, self._curve(times, grid[i])) for i in top.tolist()]
        self._at = now
        return self._cached

    def _curve(self, times: list[float], row: np.ndarray) -> tuple[tuple[float, float], ...]:
        return tuple(zip(times, row.tolist())) if self._with_curve else ()

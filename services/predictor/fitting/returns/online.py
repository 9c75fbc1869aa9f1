"""Online learning of the session-return model: it fits itself from the
arrivals and turn ends the predictor receives (issue 45, item 1).

Algorithm (OnlineReturnFitter; the caller supplies `now`, or the injected
clock does; the fitter reads no environment and makes no call):
- Traffic: every arrival and turn end goes to a TurnLog (turn_log.py): a
  sliding window of window_s seconds, at most max_turn_ends turn ends.
- Cold start: nothing is served (ForecastReturns is FAILED_PRECONDITION,
  the planner plans on bursts alone) until the first fit, unless a warm
  start (an offline model) was given; then that is served from the start.
- First fit: once the log holds min_turn_ends turn ends spanning at least
  min_history_s (due(now)). Refits: every refit_interval_s after the last
  attempt, on the window as it is then.
- A fit: the window's turns (turns.py records, rows from the one online
  builder, dataset.py) are split at cut = now - holdout_fraction x (now -
  the window's first turn end). The candidate trains on the rows before the
  cut with labels censored at the cut (train_return_model, exactly as
  offline), so nothing of the held-out tail decides a training label.
  Held out: the rows ending at or after the cut, each horizon's label where
  its window closed by now. Score: the Brier score of the monotone horizon
  probabilities, averaged over the horizons that have held-out rows (lower
  is better).
- Validation: the candidate is served only when its score is at most
  (1 + tolerance) x the served model's score on the same rows; with none
  served, against the constant-rate baseline fitted on the same training
  rows (baselines.ConstantRate), and when the baseline scores better it is
  the baseline that is served (a ReturnModel without boosters: each
  horizon's training base rate). Too few held-out rows (< min_holdout_rows)
  serve nothing new.
- Swap: fit_now returns the model; the caller installs it with one reference
  assignment under its own lock (the fit never holds the lock that
  forecasts take). The fitter's own lock guards the log and is held only to
  append or copy.

Every served model carries a FitRecord: its version (online-N), the
training window [window_start_s, cut) on the caller's clock, when it was
fitted, its held-out score and the score of what it replaced.
"""
from __future__ import annotations

import enum
import logging
import math
import threading
from dataclasses import dataclass

import numpy as np

from speckv.services.common.clock import Clock
from speckv.services.predictor.fitting.returns.config import OnlineSettings, ReturnConfig
from speckv.services.predictor.fitting.returns.dataset import ReturnRows, build_rows
from speckv.services.predictor.fitting.returns.model_training import train_return_model
from speckv.services.predictor.fitting.returns.turn_log import TurnLog
from speckv.services.predictor.fitting.returns.turns import TurnRecord
from speckv.services.predictor.serving.returns.model import HorizonFit, ReturnModel

log = logging.getLogger(__name__)


class FitOutcome(enum.Enum):
    SERVED = "served"  # validated no worse than what it replaces: serve it
    KEPT = "kept"  # validated worse: the served model stays
    WAITING = "waiting"  # too little traffic to fit or to validate
    FAILED = "failed"  # training raised; the served model stays


@dataclass(frozen=True, slots=True)
class FitRecord:
    """What a served model was trained on and how it validated (NaN: not scored)."""

    version: str
    origin: str  # "online", "online baseline" (the constant rate won), "warm start" (offline)
    fitted_at_s: float  # NaN for a warm start
    window_start_s: float  # first turn end trained on; NaN for a warm start
    window_end_s: float  # the cut: training labels censored here
    turn_ends: int  # turn ends in the window fitted on
    holdout_rows: int
    holdout_score: float  # mean Brier over horizons on the held-out tail
    replaced_score: float  # the served model's (or the baseline's) on the same rows


@dataclass(frozen=True, slots=True)
class FitResult:
    outcome: FitOutcome
    reason: str
    model: ReturnModel | None = None  # set when SERVED
    record: FitRecord | None = None  # the candidate's (SERVED, KEPT)


class OnlineReturnFitter:
    def __init__(self, config: ReturnConfig, settings: OnlineSettings, clock: Clock,
                 warm: ReturnModel | None = None, warm_version: str = "") -> None:
        settings.validate()
        self._config, self._settings, self._clock = config, settings, clock
        self._lock = threading.Lock()
        self._log = TurnLog(settings.window_s, settings.max_turn_ends)
        self._serial = 0
        self._last_attempt_s = -math.inf
        self._model = warm
        nan = math.nan
        self._record = (FitRecord(warm_version or "warm-start", "warm start", nan, nan, float(warm.extra.get(
            "until_s", nan)), 0, 0, nan, nan) if warm is not None else None)
        self.last: FitResult | None = None

    # --- traffic ----------------------------------------------------------------
    def arrival(self, conversation: str, time_s: float, prompt_tokens: int = 0) -> None:
        with self._lock:
            self._log.arrival(conversation, time_s, prompt_tokens)

    def turn_end(self, conversation: str, end_s: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 follow_ups: float = 0.0) -> None:
        with self._lock:
            self._log.turn_end(conversation, end_s, arrival_s, prompt_tokens, output_tokens, int(follow_ups))

    # --- what is served ------------------------------------------------------------
    @property
    def served(self) -> tuple[ReturnModel, FitRecord] | None:
        model, record = self._model, self._record
        return (model, record) if model is not None and record is not None else None

    @property
    def settings(self) -> OnlineSettings:
        return self._settings

    def traffic(self) -> tuple[int, int]:
        """(arrivals, turn ends) received since start."""
        with self._lock:
            return self._log.arrivals_total, self._log.turn_ends_total

    def replay(self) -> tuple[list[TurnRecord], list[tuple[str, float, int]]]:
        """The held turns and the arrivals still without an end: what a
        tracker created at the first fit is warmed with."""
        with self._lock:
            return self._log.turns(), self._log.arrivals_without_end()

    # --- fitting ---------------------------------------------------------------------
    def due(self, now: float | None = None) -> bool:
        """Whether fit_now would try: enough traffic, and refit_interval_s
        since the last attempt."""
        now = self._clock.now() if now is None else now
        s = self._settings
        if now - self._last_attempt_s < s.refit_interval_s:
            return False
        with self._lock:
            ends, oldest = len(self._log), self._log.oldest_end_s
        return ends >= s.min_turn_ends and now - oldest >= s.min_history_s

    def fit_now(self, now: float | None = None) -> FitResult:
        """One fit on the window at now (module docstring); never raises."""
        now = self._clock.now() if now is None else now
        self._last_attempt_s = now
        try:
            result = self._fit(now)
        except Exception as exc:  # a broken fit must never take the service (or a simulation) down
            log.exception("online return fit failed")
            result = FitResult(FitOutcome.FAILED, f"{type(exc).__name__}: {exc}")
        if result.outcome is FitOutcome.SERVED:
            self._model, self._record = result.model, result.record  # reference swaps: readers see one or the other
        self.last = result
        return result

    def _fit(self, now: float) -> FitResult:
        s, config = self._settings, self._config
        with self._lock:
            self._log.prune()
            turns = [t for t in self._log.turns() if t.end_s <= now]
        if len(turns) < s.min_turn_ends:
            return FitResult(FitOutcome.WAITING, f"{len(turns)} turn ends, fewer than {s.min_turn_ends}")
        start = turns[0].end_s
        cut = now - s.holdout_fraction * (now - start)
        # A turn's return after now is not known yet: the log may already hold it (a simulation's arrivals).
        turns = [t if t.next_arrival_s is None or t.next_arrival_s <= now else _unreturned(t) for t in turns]
        rows = build_rows(turns, config.features)
        held = np.flatnonzero(rows.end_s >= cut)
        horizons = config.horizons_s
        known = rows.known(horizons, now)[held]
        if int(known.any(axis=1).sum()) < s.min_holdout_rows:
            return FitResult(FitOutcome.WAITING, f"fewer than {s.min_holdout_rows} held-out rows with a known label")
        candidate = train_return_model(rows, horizons, cut, config.lightgbm, config.validation_fraction)
        baseline = constant_model(rows, horizons, cut, candidate)
        tail = rows.take(held)
        score = brier(candidate, tail, known)
        self._serial += 1
        if self._model is None:
            reference, origin = brier(baseline, tail, known), "online"
            if reference < score:
                candidate, score, origin = baseline, reference, "online baseline"
        else:
            reference, origin = brier(self._model, tail, known), "online"
        candidate.extra["until_s"] = cut
        version = f"online-{self._serial}"
        record = FitRecord(version, origin, now, start, cut, len(turns), len(tail), score, reference)
        if self._model is not None and not score <= (1.0 + s.tolerance) * reference:
            return FitResult(FitOutcome.KEPT, f"held-out Brier {score:.5f} above the served model's {reference:.5f}",
                             record=record)
        return FitResult(FitOutcome.SERVED, f"held-out Brier {score:.5f} against {reference:.5f}", candidate, record)


def _unreturned(turn: TurnRecord) -> TurnRecord:
    return TurnRecord(turn.conversation, turn.turn_index, turn.arrival_s, turn.end_s, turn.prompt_tokens,
                      turn.output_tokens, None, turn.follow_ups)


def brier(model: ReturnModel, rows: ReturnRows, known: np.ndarray) -> float:
    """Mean over horizons (those with a known row) of the Brier score of
    model's monotone P(return within t) on rows whose label is known."""
    if not len(rows):
        return math.nan
    p = model.predict_cdf(rows.X)
    labels = rows.labels(model.horizons_s).astype(np.float64)
    scores = [float(np.mean((p[known[:, i], i] - labels[known[:, i], i]) ** 2))
              for i in range(len(model.horizons_s)) if known[:, i].any()]
    return float(np.mean(scores)) if scores else math.nan


def constant_model(rows: ReturnRows, horizons_s: tuple[float, ...], until_s: float,
                   like: ReturnModel) -> ReturnModel:
    """The constant-rate baseline as a servable ReturnModel: no boosters, each
    horizon's base rate over the rows whose label was known by until_s, and
    the candidate's Kaplan-Meier tail."""
    labels, known = rows.labels(horizons_s), rows.known(horizons_s, until_s)
    fits = []
    for i, h in enumerate(horizons_s):
        n = int(known[:, i].sum())
        rate = float((labels[:, i] & known[:, i]).sum() / n) if n else 0.0
        fits.append(HorizonFit(h, n, 0, rate, 0, math.nan))
    return ReturnModel(tuple(horizons_s), like.feature_names, [None] * len(horizons_s), fits, like.tail)

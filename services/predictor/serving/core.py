"""The predictor core: arrival series in, per-family count forecasts out.

Thread-safety: one lock guards the series, the counters and the model in
service; forecasts run under it (they read the ring), model loading does not
(file IO and validation happen first, then the swap is one assignment under
the lock). A model that fails to load or validate is never swapped in.

Features: when the model in service reads features (LightGBM), the core keeps
LiveFeatures in step with the series (live_features.py): updated
incrementally as steps complete, rebuilt from the window on a swap to a
model with other feature parameters.

Time: observations carry their own time_s; forecasts are made at `now_s`
(default: the injected clock), clamped up to the newest observation counted so
the series never holds arrivals "after now".

Top families: ranked by the model's Ranking (models.py): every tracked
family's expected count at the first horizon the cheapest way the model has,
then the full forecast for the kept rows only; equal, row for row and in
order, to forecasting every tracked family and ranking the result. Per-row
values a model derives from the features are kept between calls in the
core's Memos, emptied when a model is swapped in.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from speckv.services.common.clock import Clock
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family
from speckv.services.predictor.serving.arrival_ring import ArrivalPlacement, ArrivalSeries
from speckv.services.predictor.serving.clock_skew import checked_now
from speckv.services.predictor.serving.count_models import CountModel, Memos, SeriesState, rank_rows
from speckv.services.predictor.serving.live_features import LiveFeatures
from speckv.services.predictor.serving.manifest import MAX_PATH_CHARS
from speckv.services.predictor.serving.observations import (
    Arrival,
    ObserveResult,
    Rejection,
    RejectReason,
    check_arrival,
)
from speckv.services.predictor.serving.selection import Choice

if TYPE_CHECKING:  # annotations only: the core passes the model's choices through, never builds one
    from speckv.services.predictor.serving.burst_choice import HorizonBurstChoice

BUILTIN_SOURCE = "builtin"


@dataclass(frozen=True, slots=True)
class PredictorSettings:
    """Series shape and request limits. Seconds throughout."""

    step_s: float = 1.0
    window_s: float = 600.0
    max_families_per_call: int = 100_000
    max_horizons_per_call: int = 64
    max_horizon_s: float = 600.0
    max_future_s: float = 60.0  # observations further ahead of the clock are refused; 0: no limit
    max_family_len: int = 1024
    # A forecast's now_s further than this from the clock (either way) is
    # refused: a far-future now would take idle steps into the features that
    # later arrivals can no longer correct. 0: no limit.
    max_clock_skew_s: float = 300.0
    # Most families tracked at once; a new family past it drops the least
    # recently seen one (memory: docs/limits.md, about 3.5 KB a family with
    # the builtin EWMA, 10 KB with LightGBM's online features). 0: no cap.
    max_families_tracked: int = 1_000_000
    reload_probe_timeout_s: float = 60.0  # a candidate model must load and predict in the probe within this
    # The directory ReloadModel's names are resolved under (model_root.py); empty: no reloads
    model_root: str = ""

    @property
    def window_steps(self) -> int:
        return round(self.window_s / self.step_s)

    def validate(self) -> None:
        for name in ("step_s", "window_s", "max_horizon_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name}={value}: must be finite and > 0")
        if self.window_steps < 2 or abs(self.window_steps * self.step_s - self.window_s) > 1e-9 * self.window_s:
            raise InvalidArgument(f"window_s={self.window_s}: must be a whole number (>= 2) of step_s={self.step_s}")
        for name in ("max_future_s", "max_clock_skew_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"{name}={value}: must be finite and >= 0")
        if not (math.isfinite(self.reload_probe_timeout_s) and self.reload_probe_timeout_s > 0):
            raise InvalidArgument(f"reload_probe_timeout_s={self.reload_probe_timeout_s}: must be finite and > 0")
        if len(self.model_root) > MAX_PATH_CHARS or "\x00" in self.model_root:
            raise InvalidArgument(f"model_root: at most {MAX_PATH_CHARS} characters and no NUL")
        if self.max_families_tracked < 0:
            raise InvalidArgument(f"max_families_tracked={self.max_families_tracked}: must be >= 0 (0: no cap)")
        for name in ("max_families_per_call", "max_horizons_per_call", "max_family_len"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 1")


@dataclass(slots=True)
class ForecastResult:
    """Rows follow `families`; arrays have shape (families, horizons)."""

    families: list[str]
    known: np.ndarray  # bool: False where the family's prior was used
    horizons_s: np.ndarray
    expected: np.ndarray
    upper: np.ndarray
    burst_probability: np.ndarray
    model_version: str
    now_s: float


@dataclass(slots=True)
class ModelInfoRecord:
    name: str
    version: str
    horizons_s: tuple[float, ...]
    quantile: float
    features: tuple[str, ...]
    metrics: dict[str, float]
    source: str
    loaded_at_s: float
    families_tracked: int
    observations_total: int
    burst_definition: str
    # the served point forecast per horizon and family class (selection.py); empty: the model's own mean
    choices: tuple[Choice, ...] = ()
    family_classes: str = ""
    # how the model's trees are evaluated: compiled, or LightGBM's predict and why (empty: no trees)
    inference: str = ""
    # the burst probability's source per horizon (burst_model.py); empty: no classifier, the distribution
    burst_choices: tuple[HorizonBurstChoice, ...] = ()


@dataclass(slots=True)
class _Serving:
    model: CountModel
    source: str
    loaded_at_s: float


@dataclass(slots=True)
class _Counters:
    accepted: int = 0
    late: int = 0  # accepted into an older step the window still holds
    rejected: dict[RejectReason, int] = field(default_factory=lambda: {r: 0 for r in RejectReason})


class PredictorCore:
    def __init__(self, clock: Clock, model: CountModel, settings: PredictorSettings,
                 source: str = BUILTIN_SOURCE) -> None:
        settings.validate()
        self._clock = clock
        self._settings = settings
        self._lock = threading.Lock()
        self._series = ArrivalSeries(settings.step_s, settings.window_steps,
                                     max_families=settings.max_families_tracked)
        self._counters = _Counters()
        self._check_fits(model)
        self._serving = _Serving(model, source, clock.now())
        self._features: LiveFeatures | None = None
        self._memos = Memos()
        self._follow_features(model)

    # --- observations --------------------------------------------------------

    def observe(self, arrivals: Iterable[Arrival]) -> ObserveResult:
        """Counts every valid arrival; rejects the others one by one, each with
        a counted reason. Never raises for a bad observation."""
        s = self._settings
        latest_allowed = self._clock.now() + s.max_future_s if s.max_future_s > 0 else math.inf
        result = ObserveResult()
        with self._lock:
            for arrival in arrivals:
                rejection = check_arrival(arrival, s.max_family_len, latest_allowed)
                if rejection is None:
                    self._complete_steps_before(arrival.time_s)
                    placement = self._series.add(arrival.family, arrival.time_s)
                    if placement is ArrivalPlacement.TOO_OLD:
                        rejection = Rejection(RejectReason.TOO_OLD, f"time_s={arrival.time_s!r} is before the "
                                              f"{s.window_s:g} s window the predictor holds")
                    elif placement is ArrivalPlacement.COUNTED_LATE:
                        self._counters.late += 1
                if rejection is None:
                    result.accepted += 1
                else:
                    self._counters.rejected[rejection.reason] += 1
                    result.reject(rejection)
            self._counters.accepted += result.accepted
        return result

    # --- forecasts -----------------------------------------------------------

    def forecast(self, families: Sequence[str], horizons_s: Sequence[float] = (), now_s: float | None = None,
                 max_families: int = 0) -> ForecastResult:
        """Forecasts for `families` (one row each, in order). With no
        families: every tracked family, ranked by expected count at the first
        horizon (best first; ties: the lower series row first, i.e. the order
        of tracked_families()) and cut to max_families (0: all, up to
        max_families_per_call)."""
        self._check_families(families)
        if max_families < 0:
            raise InvalidArgument(f"max_families={max_families}: must be >= 0")
        horizons = self._horizons(horizons_s)
        now = self._now(now_s)
        with self._lock:
            model = self._serving.model
            horizons = horizons if horizons is not None else np.asarray(model.horizons_s, dtype=np.float64)
            now = max(now, self._series.latest_time_s)
            names: list[str]
            if len(families):
                names, rows = list(families), self._series.rows_of(families)
                out = model.forecast(self._state(rows, now), now, horizons)
            else:
                limit = min(max_families or self._settings.max_families_per_call, self._settings.max_families_per_call)
                tracked = self._series.tracked_rows()
                ranking = rank_rows(model, self._state(tracked, now), now, horizons)
                order = top_order(ranking.key, limit)
                out = ranking.select(order)
                rows = tracked[order]
                names = list[str](self._series.families_at(rows))  # Family is a str
        return ForecastResult(names, rows >= 0, horizons, out.expected, out.upper, out.burst_probability,
                              model.version, now)

    def _state(self, rows: np.ndarray, now: float) -> SeriesState:
        """What the model reads at now, features brought up to the last
        complete step. Call under the lock."""
        if self._features is None:
            return SeriesState(self._series, rows, memos=self._memos)
        self._features.sync(self._series, self._series.step_of(now) - 1)
        return SeriesState(self._series, rows, self._features.online, self._features.version, self._memos)

    def top_families(self, k: int, horizons_s: Sequence[float] = (), now_s: float | None = None) -> ForecastResult:
        """The k tracked families with the largest expected count at the first horizon."""
        if k < 1:
            raise InvalidArgument(f"k={k}: must be >= 1")
        return self.forecast((), horizons_s, now_s, max_families=k)

    def tracked_families(self) -> list[Family]:
        """Every tracked family, in series-row order: the order top_families
        breaks ties in."""
        with self._lock:
            return self._series.tracked()[0]

    # --- models --------------------------------------------------------------

    def model_info(self) -> ModelInfoRecord:
        with self._lock:
            serving, tracked, total = self._serving, self._series.families_tracked, self._counters.accepted
        m = serving.model
        return ModelInfoRecord(m.name, m.version, tuple(m.horizons_s), m.quantile, tuple(m.features),
                               dict(m.metrics), serving.source, serving.loaded_at_s, tracked, total,
                               m.burst_definition, tuple(getattr(m, "choices", ())),
                               str(getattr(m, "family_classes", "")), str(getattr(m, "inference", "")),
                               tuple(getattr(m, "burst_choices", ())))

    @property
    def settings(self) -> PredictorSettings:
        return self._settings

    def install(self, model: CountModel, source: str) -> None:
        """Swaps model in atomically after checking it fits this series."""
        self._check_fits(model)
        serving = _Serving(model, source, self._clock.now())
        with self._lock:
            self._follow_features(model)
            self._serving = serving
            self._memos = Memos()  # values derived by the old model

    def snapshot(self) -> tuple[list[str], np.ndarray, int, float]:
        """(families, counts (families, window steps), first step, step_s):
        a copy of the window, for retraining off the lock."""
        with self._lock:
            families, counts, first = self._series.snapshot()
        return families, counts, first, self._settings.step_s

    @property
    def serving_model(self) -> CountModel:
        with self._lock:
            return self._serving.model

    # --- features --------------------------------------------------------------

    def _follow_features(self, model: CountModel) -> None:
        """Keeps (or builds, replaying the window) the features model reads.
        Call under the lock or before the core is shared."""
        spec = getattr(model, "feature_spec", None)
        if spec is None:
            self._features = None
        elif self._features is None or self._features.spec != spec:
            features = LiveFeatures(spec, self._series)
            head = self._series.head_step
            if head is not None:
                features.sync(self._series, head - 1)
            self._features = features
            self._memos = Memos()  # keyed by the old features' versions

    def _complete_steps_before(self, time_s: float) -> None:
        """An observation in a newer step completes the steps before it:
        the features take them in before the ring can move past them."""
        head = self._series.head_step
        if self._features is not None and head is not None and self._series.step_of(time_s) > head:
            self._features.sync(self._series, self._series.step_of(time_s) - 1)

    # --- counters for metrics ------------------------------------------------

    def counters(self) -> dict[str, int]:
        """accepted, late and rejected_<reason> totals since start."""
        with self._lock:
            out = {"accepted": self._counters.accepted, "late": self._counters.late}
            out.update({f"rejected_{r.value}": n for r, n in self._counters.rejected.items()})
        return out

    @property
    def families_tracked(self) -> int:
        with self._lock:
            return self._series.families_tracked

    @property
    def families_dropped(self) -> int:
        """Families dropped at the max_families_tracked cap since start
        (the least recently seen first; idle ones forgotten are not counted)."""
        with self._lock:
            return self._series.evicted

    # --- checks --------------------------------------------------------------

    def _check_fits(self, model: CountModel) -> None:
        s = self._settings
        if model.history_s > s.window_s:
            raise InvalidArgument(f"the model reads {model.history_s:g} s of history but window_s={s.window_s:g}; "
                                  "shorten its half-lives or widen the window")
        spec = getattr(model, "feature_spec", None)
        if spec is not None and abs(spec.step_s - s.step_s) > 1e-12:
            raise InvalidArgument(f"the model's features use step_s={spec.step_s:g} but the series steps "
                                  f"{s.step_s:g} s")
        if max(model.horizons_s) > s.max_horizon_s:
            raise InvalidArgument(f"horizons_s={list(model.horizons_s)}: above max_horizon_s={s.max_horizon_s:g}")

    def _check_families(self, families: Sequence[str]) -> None:
        s = self._settings
        if len(families) > s.max_families_per_call:
            raise InvalidArgument(f"families: {len(families)} given, at most {s.max_families_per_call} per call")
        for i, family in enumerate(families):
            if not family:
                raise InvalidArgument(f"families[{i}] is empty")
            if len(family) > s.max_family_len:
                raise InvalidArgument(f"families[{i}] is longer than {s.max_family_len} characters")

    def _horizons(self, horizons_s: Sequence[float]) -> np.ndarray | None:
        s = self._settings
        if not len(horizons_s):
            return None
        if len(horizons_s) > s.max_horizons_per_call:
            raise InvalidArgument(f"horizons_s: {len(horizons_s)} given, at most {s.max_horizons_per_call}")
        for i, h in enumerate(horizons_s):
            if not (math.isfinite(h) and 0 < h <= s.max_horizon_s):
                raise InvalidArgument(f"horizons_s[{i}]={h}: must be > 0 and <= {s.max_horizon_s:g}")
        return np.asarray(horizons_s, dtype=np.float64)

    def _now(self, now_s: float | None) -> float:
        """now_s checked against the clock (clock_skew.py)."""
        return checked_now(now_s, self._clock.now(), self._settings.max_clock_skew_s)


def top_order(values: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the `limit` largest values, largest first, ties in index
    order, NaN last: exactly np.argsort(-values, kind="stable")[:limit], in
    O(n) (a partition) plus a sort of the kept indices."""
    n = len(values)
    if limit >= n or np.isnan(values).any():
        return np.argsort(-values, kind="stable")[:limit]
    if limit <= 0:
        return np.zeros(0, dtype=np.int64)
    neg = -values
    kth = np.partition(neg, limit - 1)[limit - 1]
    better = np.flatnonzero(neg < kth)  # fewer than limit
    tied = np.flatnonzero(neg == kth)[:limit - len(better)]
    kept = np.sort(np.concatenate([better, tied]))
    return kept[np.argsort(neg[kept], kind="stable")]

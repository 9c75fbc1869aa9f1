"""PredictorCore.top_families(k) ranks every tracked family but forecasts only
the k it keeps; its rows must equal, bit for bit and in order, forecasting
every tracked family and ranking by expected count at the first horizon
(stable: ties in tracked_families() order), for every model kind, on
random streams of thousands of families with ties, forgotten families whose
rows are reused, families added within a step, and repeated calls within a
step (the per-step memos)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.family_counts import aggregate
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.serving import count_models as models
from speckv.services.predictor.serving.core import ForecastResult, PredictorCore, PredictorSettings, top_order
from speckv.services.predictor.serving.count_models import (
    CountForecast,
    CountModel,
    EwmaModel,
    EwmaParams,
    LastValueModel,
    RateParams,
    SeriesState,
)
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.observations import Arrival

SPAN_S = 900.0  # longer than the 600 s window: early families are forgotten and their rows reused
CHECKPOINTS_S = (400.3, 400.6, 400.95, 650.2, 650.7, 899.4)  # three inside one step
KINDS = ("ewma", "last-value", "lightgbm", "without-rank")
HORIZON_SETS = ((), (2.0,), (3.0, 1.0))  # the model's own; one; an untrained first horizon


class WithoutRank:
    """A CountModel with forecast() only (as any model outside this
    package): the core ranks its full forecast."""

    def __init__(self, inner: EwmaModel) -> None:
        self._inner = inner
        self.name, self.version, self.horizons_s = "without-rank", inner.version, inner.horizons_s
        self.quantile, self.features, self.metrics = inner.quantile, inner.features, inner.metrics
        self.burst_definition, self.history_s = inner.burst_definition, inner.history_s

    def forecast(self, state: SeriesState, now_s: float, horizons: np.ndarray) -> CountForecast:
        return self._inner.forecast(state, now_s, horizons)


@pytest.fixture(scope="module")
def lightgbm() -> LightGbmModel:
    """A quick model trained on a small random stream (its quality is not
    under test; some horizons get a dispersion > 0, so the negative binomial
    runs beside the Poisson)."""
    rng = np.random.default_rng(1)
    times, names = [], []
    for f, rate in enumerate(rng.gamma(0.5, 0.4, 60)):
        t = rng.uniform(0, SPAN_S, rng.poisson(rate * SPAN_S))
        times.append(t)
        names += [f"f{f}"] * len(t)
    all_times = np.concatenate(times)
    order = np.argsort(all_times, kind="stable")
    counts = aggregate(all_times[order], [names[i] for i in order], 1.0, 0.0, SPAN_S)
    bundle = train_on_counts(counts, load_config(quick=True)).bundle
    assert any(phi > 0 for phi in bundle.dispersion)
    return LightGbmModel(bundle, "topk-test")


def make_model(kind: str, lightgbm: LightGbmModel) -> CountModel:
    return {"ewma": lambda: EwmaModel(EwmaParams()), "last-value": lambda: LastValueModel(RateParams()),
            "lightgbm": lambda: lightgbm, "without-rank": lambda: WithoutRank(EwmaModel(EwmaParams()))}[kind]()


def stream(seed: int) -> list[tuple[float, str]]:
    """About 4,000 families over SPAN_S, sorted by time: sparse ones (1-3
    arrivals, many on the same whole second: tied histories), steady Poisson
    ones, bursty ones, exact twins of others, early ones that are forgotten,
    and new ones inside the checkpoint step."""
    rng = np.random.default_rng(seed)
    events: list[tuple[float, str]] = []
    for i in range(2500):
        for t in np.floor(rng.uniform(0, SPAN_S, rng.integers(1, 4))) + 0.5:
            events.append((float(t), f"sparse-{i}"))
    for i, rate in enumerate(rng.gamma(0.6, 0.05, 800)):
        events += [(float(t), f"steady-{i}") for t in rng.uniform(0, SPAN_S, rng.poisson(rate * SPAN_S) + 1)]
    for i in range(40):
        for start in rng.uniform(0, SPAN_S - 3, rng.integers(1, 4)):
            events += [(float(t), f"bursty-{i}") for t in start + rng.uniform(0, 2, rng.integers(5, 30))]
    for i in range(600):
        events += [(float(t), f"early-{i}") for t in rng.uniform(0, 250, rng.integers(1, 3))]
    twins = [(t, f"twin-{f}") for t, f in events if f.startswith(("steady-1", "sparse-2"))]
    news = [(400.45 + 0.01 * rng.random(), f"new-{i}") for i in range(300)]
    return sorted(events + twins + news)


def fed(kind: str, lightgbm: LightGbmModel, events: list[tuple[float, str]],
        checkpoint: Callable[[PredictorCore, float], None] | None = None) -> PredictorCore:
    """A core fed events up to SPAN_S; checkpoint(core, t) runs at each of
    CHECKPOINTS_S after the events before it."""
    clock = ManualClock(0.0)
    core = PredictorCore(clock, make_model(kind, lightgbm), PredictorSettings())
    i = 0
    for t in (*CHECKPOINTS_S, SPAN_S):
        j = i
        while j < len(events) and events[j][0] < t:
            j += 1
        clock.set(t)
        assert core.observe([Arrival(time, family) for time, family in events[i:j]]).accepted == j - i
        i = j
        if checkpoint is not None and t < SPAN_S:
            checkpoint(core, t)
    return core


def ranked(full: ForecastResult) -> np.ndarray:
    """The documented order: expected at the first horizon, descending, ties in row order."""
    return np.argsort(-full.expected[:, 0], kind="stable")


def assert_rows_equal(top: ForecastResult, full: ForecastResult, index: np.ndarray) -> None:
    assert top.families == [full.families[i] for i in index.tolist()]
    assert top.known.all() and top.model_version == full.model_version and top.now_s == full.now_s
    np.testing.assert_array_equal(top.horizons_s, full.horizons_s)
    for name in ("expected", "upper", "burst_probability"):
        mine, theirs = getattr(top, name), getattr(full, name)[index]
        assert mine.shape == theirs.shape and mine.tobytes() == theirs.tobytes(), name  # bit for bit


def check_top_equals_full(core: PredictorCore, reference: PredictorCore, now: float, ks: list[int]) -> None:
    names = reference.tracked_families()
    assert core.tracked_families() == names
    for horizons in HORIZON_SETS:
        full = reference.forecast(names, horizons, now_s=now)
        order = ranked(full)
        for k in ks:
            assert_rows_equal(core.top_families(k, horizons, now_s=now), full, order[:k])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_families_equal_the_full_forecast_ranked(kind, seed, lightgbm):
    events = stream(seed)

    def checkpoint(core: PredictorCore, t: float) -> None:
        # Within one step the memos are reused, and families added since are filled in.
        check_top_equals_full(core, core, t, [1, 5, 256])

    core = fed(kind, lightgbm, events, checkpoint)
    fresh = fed(kind, lightgbm, events)  # never asked before: no memo, no kept product
    now = SPAN_S - 0.05  # in the step of the last arrivals
    core.top_families(256, now_s=now)  # keeps what it may for this instant and step
    # More arrivals before now in the same step (old and new families): what was kept must not be reused.
    more = [Arrival(now - 0.01, f) for f in [*fresh.tracked_families()[::7], *(f"late-{i}" for i in range(50))]]
    for c in (core, fresh):
        assert c.observe(more).accepted == len(more)
    n = len(fresh.tracked_families())
    assert n > 3000 and core.families_tracked == n
    assert not any(f.startswith("early-") for f in fresh.tracked_families())  # forgotten, rows reused
    check_top_equals_full(core, fresh, now, [1, 5, n - 1, n, n + 1])
    ties = fresh.forecast(fresh.tracked_families(), now_s=now).expected[:, 0]
    assert len(np.unique(ties)) < n  # the ranking did meet ties


@pytest.mark.parametrize("kind", ["ewma", "last-value"])
def test_rows_whose_burst_threshold_may_step_take_the_exact_level(kind, lightgbm, monkeypatch):
    """With a slack so wide that most rows with traffic look near a step of
    floor(threshold), select() takes the long-run rate from the product over
    every row; the rows still equal the full forecast."""
    monkeypatch.setattr(models, "SLACK_UNITS", 1e7)
    core = fed(kind, lightgbm, stream(3))
    n = core.families_tracked
    check_top_equals_full(core, core, SPAN_S - 0.05, [5, 256, n])


def test_a_lightgbm_forecast_right_after_the_rows_grow_within_a_step(lightgbm):
    """The series doubles its rows inside a step the features already took
    in: the new rows read as fresh families instead of failing."""
    core = PredictorCore(ManualClock(100.0), lightgbm, PredictorSettings())
    core.observe([Arrival(10.5, f"a{i}") for i in range(10)] + [Arrival(11.5, "b")])
    before = core.top_families(3, now_s=11.6)
    core.observe([Arrival(11.7, f"n{i}") for i in range(100)])  # past the first 64 rows, same step
    after = core.top_families(200, now_s=11.8)
    assert len(after.families) == 111 and after.families[:3] == before.families
    fresh = core.forecast([f"n{i}" for i in range(100)], now_s=11.8)
    unknown = core.forecast(["never-seen"], now_s=11.8)
    np.testing.assert_array_equal(fresh.expected, np.repeat(unknown.expected, 100, axis=0))


@pytest.mark.parametrize("seed", range(20))
def test_top_order_is_the_stable_descending_argsort(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    values = rng.integers(0, int(rng.integers(1, 50)), n).astype(np.float64)  # heavy ties
    values[rng.random(n) < 0.1] = -0.0
    if seed % 3 == 0:
        values[rng.random(n) < 0.05] = np.nan
    expected = np.argsort(-values, kind="stable")
    for k in {1, 2, 5, n // 3, n - 1, n, n + 1} - {0}:
        np.testing.assert_array_equal(top_order(values, k), expected[:k])

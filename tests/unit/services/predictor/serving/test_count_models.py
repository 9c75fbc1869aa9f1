"""Rate baselines: EWMA convergence, Poisson upper quantile, burst probability, priors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from speckv.services.predictor.serving import poisson
from speckv.services.predictor.serving.arrival_ring import ArrivalSeries
from speckv.services.predictor.serving.count_models import (
    BURST_DEFINITION,
    EwmaModel,
    EwmaParams,
    LastValueModel,
    RateParams,
    SeriesState,
)
from speckv.services.predictor.serving.rates import ewma_rates, last_step_rates

HORIZONS = np.array([1.0, 2.0, 5.0, 10.0])


def poisson_times(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    n = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, n))


def feed(series: ArrivalSeries, family: str, times: np.ndarray) -> None:
    for t in times:
        series.add(family, float(t))


def state(series: ArrivalSeries, *families: str) -> SeriesState:
    return SeriesState(series, series.rows_of(list(families)))


@pytest.mark.parametrize("rate", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("halflife_s", [10.0, 60.0])
def test_ewma_converges_to_a_steady_poisson_rate(rate: float, halflife_s: float) -> None:
    rng = np.random.default_rng(42)
    series = ArrivalSeries(1.0, 600)
    feed(series, "f", poisson_times(rng, rate, 0.0, 400.0))
    estimates = [ewma_rates(series, series.rows_of(["f"]), now, halflife_s).rates[0]
                 for now in (400.0, 400.5)]
    # The estimate's standard deviation is sqrt(rate * ln2 / (2 * halflife)).
    tolerance = 4 * math.sqrt(rate * math.log(2) / (2 * halflife_s))
    for estimate in estimates:
        assert estimate == pytest.approx(rate, abs=tolerance)


def test_ewma_is_unbiased_on_a_short_history() -> None:
    # 30 s of history with a 60 s half-life: the exposure normalisation, not
    # zeros before the first observation, decides the estimate.
    rng = np.random.default_rng(7)
    estimates = []
    for _ in range(200):
        series = ArrivalSeries(1.0, 600)
        series.add("anchor", 0.0)
        feed(series, "f", poisson_times(rng, 3.0, 0.0, 30.0))
        estimates.append(ewma_rates(series, series.rows_of(["f"]), 30.0, 60.0).rates[0])
    assert np.mean(estimates) == pytest.approx(3.0, rel=0.05)


def test_expected_is_rate_times_horizon_and_upper_is_the_poisson_quantile() -> None:
    rng = np.random.default_rng(1)
    series = ArrivalSeries(1.0, 600)
    feed(series, "f", poisson_times(rng, 4.0, 0.0, 300.0))
    model = EwmaModel(EwmaParams(quantile=0.95))
    out = model.forecast(state(series, "f"), 300.0, HORIZONS)
    rate = ewma_rates(series, series.rows_of(["f"]), 300.0, 10.0).rates[0]
    np.testing.assert_allclose(out.expected[0], rate * HORIZONS)
    np.testing.assert_array_equal(out.upper[0], stats.poisson.ppf(0.95, rate * HORIZONS))
    assert out.expected.shape == out.upper.shape == out.burst_probability.shape == (1, 4)


def test_burst_probability_rises_when_a_family_rate_jumps() -> None:
    rng = np.random.default_rng(5)
    series = ArrivalSeries(1.0, 600)
    feed(series, "f", poisson_times(rng, 1.0, 0.0, 300.0))
    model = EwmaModel(EwmaParams())
    before = model.forecast(state(series, "f"), 300.0, HORIZONS).burst_probability[0]
    feed(series, "f", poisson_times(rng, 10.0, 300.0, 315.0))
    after = model.forecast(state(series, "f"), 315.0, HORIZONS).burst_probability[0]
    assert before.max() < 0.05
    assert after[2] > 0.5  # 5 s horizon
    assert (after > before).all()


def test_burst_threshold_is_the_family_own_level() -> None:
    # Two families at steady but different rates: neither is bursting, so both
    # have a low burst probability even though one is 20x busier.
    rng = np.random.default_rng(11)
    series = ArrivalSeries(1.0, 600)
    feed(series, "calm", poisson_times(rng, 1.0, 0.0, 400.0))
    feed(series, "busy", poisson_times(rng, 20.0, 0.0, 400.0))
    out = EwmaModel(EwmaParams()).forecast(state(series, "calm", "busy"), 400.0, HORIZONS)
    assert out.burst_probability.max() < 0.05
    assert out.expected[1, 0] > 10 * out.expected[0, 0]


def test_unknown_family_gets_the_cluster_mean_prior() -> None:
    series = ArrivalSeries(1.0, 600)
    for t in np.arange(0.0, 100.0, 0.25):  # a: 4/s
        series.add("a", float(t))
    for t in np.arange(0.0, 100.0, 1.0):  # b: 1/s
        series.add("b", float(t))
    rows = series.rows_of(["a", "b", "never-seen"])
    estimate = ewma_rates(series, rows, 100.0, 10.0)
    assert estimate.prior == pytest.approx((estimate.rates[0] + estimate.rates[1]) / 2, rel=1e-4)
    assert estimate.rates[2] == estimate.prior
    out = EwmaModel(EwmaParams()).forecast(SeriesState(series, rows), 100.0, HORIZONS)
    assert np.isfinite(out.expected[2]).all() and out.expected[2, 0] == pytest.approx(estimate.prior)


def test_empty_series_forecasts_zero() -> None:
    series = ArrivalSeries(1.0, 600)
    out = EwmaModel(EwmaParams()).forecast(state(series, "x", "y"), 10.0, HORIZONS)
    assert not out.expected.any() and not out.upper.any() and not out.burst_probability.any()


def test_last_value_uses_the_newest_complete_step() -> None:
    series = ArrivalSeries(0.5, 100)
    for t in (10.0, 10.1, 10.2, 10.6):  # step 20 holds 3, step 21 holds 1
        series.add("f", t)
    rows = series.rows_of(["f"])
    assert last_step_rates(series, rows, 10.75).rates[0] == 6.0  # step 20: 3 in 0.5 s
    assert last_step_rates(series, rows, 11.1).rates[0] == 2.0  # step 21: 1 in 0.5 s
    assert last_step_rates(series, rows, 50.0).rates[0] == 0.0  # nothing lately
    out = LastValueModel(RateParams()).forecast(SeriesState(series, rows), 10.75, HORIZONS)
    np.testing.assert_allclose(out.expected[0], 6.0 * HORIZONS)


def test_models_describe_themselves() -> None:
    model = EwmaModel(EwmaParams(version="v7", halflife_s=3.0))
    assert model.name == "ewma" and model.version == "v7"
    assert model.burst_definition.startswith(BURST_DEFINITION)
    assert "ewma_rate(halflife_s=3)" in model.features
    assert LastValueModel(RateParams()).name == "last-value"


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_poisson_quantile_matches_scipy(q: float) -> None:
    mu = np.concatenate([np.random.default_rng(0).gamma(0.7, 8.0, 5000), [0.0, 1e-9, 1e-3, 1e5]])
    expected = np.nan_to_num(stats.poisson.ppf(q, mu))
    np.testing.assert_array_equal(poisson.quantile(q, mu), expected)


def test_exceed_probability_matches_scipy() -> None:
    mu = np.array([0.0, 0.5, 5.0, 50.0])
    threshold = np.array([5.0, 5.0, 7.5, 150.0])
    np.testing.assert_allclose(poisson.exceed_probability(threshold, mu),
                               [0.0, *stats.poisson.sf(np.floor(threshold[1:]), mu[1:])])

"""Aggregation into one sparse array, and batch features == incremental features."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.family_counts import aggregate
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.features import OnlineFeatures, batch_features
from speckv.services.predictor.serving.observations import Arrival
from tests.support.predictor_synthetic import planted_counts


def test_aggregate_counts_per_family_and_step_in_one_sparse_array():
    counts = aggregate(np.array([0.1, 0.2, 1.5, 2.9, 0.5, 9.0]), ["b", "b", "a", "a", "c", "x"], 1.0, 0.0, 4.0)
    assert counts.families == ["b", "c", "a"]  # by first arrival; 9.0 is outside [0, 4)
    assert counts.dense(0, 3).tolist() == [[2, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0]]
    assert counts.total().tolist() == [3, 1, 1, 0]
    assert counts.first_steps().tolist() == [0, 0, 1] and counts.last_steps().tolist() == [0, 0, 2]
    assert counts.counts.indptr.tolist() == [0, 1, 2, 4]  # the boundaries


def test_feature_names_derive_from_parameters():
    spec = FeatureSpec(lags=(1, 7), windows=(4,), halflives_s=(3.0,), cluster_halflives_s=(30.0,))
    assert spec.names() == ("lag_1", "lag_7", "mean_4", "max_4", "std_4", "ewma_hl3s", "level_hl120s", "ratio_hl3s",
                            "since_burst_s", "since_arrival_s", "turns", "cluster_lag_1", "cluster_ewma_hl30s",
                            "tod_sin", "tod_cos")
    assert FeatureSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("seed,trend_spans", [(0, ()), (1, ()), (0, (2, 5, 10)), (1, (1, 3))])
def test_incremental_features_equal_batch_features_exactly(seed, trend_spans):
    rng = np.random.default_rng(seed)
    T, n = 800, 7
    counts = rng.poisson(0.4, (n, T)).astype(np.float64)
    counts[1, 200:204] += 30  # bursts
    counts[2] = 0.0
    counts[2, 700] = 4  # a late newcomer
    total = counts.sum(axis=0)
    spec = FeatureSpec(tod_offset_s=66_000.0, trend_spans=trend_spans)
    batch = batch_features(counts, total, spec, first_step=5_000)
    online = OnlineFeatures(spec, capacity=4)
    online.grow(n)
    for t in range(T):
        online.advance(5_000 + t, counts[:, t], total[t])
        np.testing.assert_array_equal(online.features(np.arange(n)), batch[:, t])
    # an unseen family reads like a row with no history
    assert (online.features(np.array([-1]))[0, :len(spec.lags)] == 0).all()


@pytest.mark.parametrize("trend_spans", [(), (2, 5, 10)])
def test_the_core_keeps_incremental_features_equal_to_batch_on_the_same_history(trend_spans):
    """The live path (arrivals through the core, steps completed by later
    arrivals) sees exactly what the batch form computes from the counts."""
    from speckv.services.predictor.serving.live_features import LiveFeatures

    data = planted_counts(400.0, seed=3)
    spec = FeatureSpec(trend_spans=trend_spans)
    core = PredictorCore(ManualClock(400.0), _FeatureReader(spec), PredictorSettings(window_s=600.0))
    dense = data.dense(0, len(data.families))
    arrivals = [Arrival(float(s) + 0.5, data.families[f]) for s in range(data.steps) for f in range(len(dense))
                for _ in range(int(dense[f, s]))]
    assert core.observe(arrivals).accepted == len(arrivals)
    result = core.forecast(data.families, now_s=float(data.steps))  # completes the last step
    batch = batch_features(dense, data.total(), spec)
    np.testing.assert_array_equal(result.expected, batch[:, -1, :1])  # lag_1 as the "forecast"
    features: LiveFeatures = core._features  # noqa: SLF001
    rows = core._series.rows_of(data.families)  # noqa: SLF001
    np.testing.assert_array_equal(features.online.features(rows), batch[:, -1])


class _FeatureReader:
    """A model that forecasts its first feature: lets the test read features through the core."""

    name, version, quantile, metrics, burst_definition = "probe", "probe", 0.9, {}, ""
    horizons_s = (1.0,)
    history_s = 1.0

    def __init__(self, spec: FeatureSpec) -> None:
        self.feature_spec = spec
        self.features = spec.names()

    def forecast(self, state, now_s, horizons):
        from speckv.services.predictor.serving.count_models import CountForecast

        x = state.features.features(state.rows)[:, :1].astype(np.float64)
        return CountForecast(x, x, np.zeros_like(x))

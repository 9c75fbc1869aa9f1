"""Level-relative LightGBM: a forecast follows a level shift training never saw;
periodic features are dropped on a history shorter than their rule allows;
the row-gathering batch features equal the full batch form."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy import sparse

from speckv.services.predictor.fitting.dataset import build_rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.serving.feature_spec import (
    MIN_PERIODS,
    SECONDS_PER_DAY,
    FeatureSpec,
    periodic_features_usable,
)
from speckv.services.predictor.serving.features import batch_feature_rows, batch_features

H5 = 2  # index of the 5 s horizon


def _counts(rates: list[tuple[float, int]], families: int, seed: int) -> FamilyCounts:
    """Poisson counts per 1 s step: each (rate per s, steps) segment in turn."""
    rng = np.random.default_rng(seed)
    dense = np.concatenate([rng.poisson(rate, (families, steps)) for rate, steps in rates], axis=1)
    return FamilyCounts([f"f{i}" for i in range(families)], sparse.csr_matrix(dense.astype(np.float64)), 1.0, 0.0)


def test_the_forecast_follows_a_level_drop_training_never_saw():
    config = load_config(quick=True)
    train = _counts([(4.0, 1500)], families=4, seed=1)
    bundle = train_on_counts(train, config).bundle
    # serve: the same families after a drop to a quarter of the level, long enough for the EWMAs to follow
    served = _counts([(4.0, 600), (1.0, 400)], families=4, seed=2)
    rows = build_rows(served, bundle.spec, config.horizons_s, config.track_s)
    late = rows.take(np.flatnonzero(rows.step >= 900))
    expected = bundle.expected(late.X)[:, H5]
    truth = late.count[:, H5].astype(np.float64)
    # trees on absolute counts stay near the lowest level training saw (about 20 per 5 s); the
    # offset carries the forecast most of the way down to the new level (about 5)
    assert 0.7 * truth.mean() < expected.mean() < 0.5 * 20.0


def test_time_of_day_is_dropped_on_a_history_shorter_than_its_rule():
    assert not periodic_features_usable(3600.0)
    assert periodic_features_usable(MIN_PERIODS * SECONDS_PER_DAY)
    config = load_config(quick=True)
    assert config.spec.time_of_day and "tod_sin" in config.spec.names()
    bundle = train_on_counts(_counts([(2.0, 900)], families=3, seed=3), config).bundle
    assert not bundle.spec.time_of_day and "tod_sin" not in bundle.spec.names()
    assert bundle.boosters["count"][0].num_feature() == len(bundle.spec.names())


def test_row_gathered_batch_features_equal_the_full_batch_form():
    rng = np.random.default_rng(4)
    counts = rng.poisson(0.3, (5, 400)).astype(np.float64)
    total = counts.sum(axis=0)
    for spec in (FeatureSpec(), replace(FeatureSpec(), time_of_day=False)):
        rows, steps = rng.integers(0, 5, 300), rng.integers(0, 400, 300)
        np.testing.assert_array_equal(batch_feature_rows(counts, total, spec, rows, steps),
                                      batch_features(counts, total, spec)[rows, steps])

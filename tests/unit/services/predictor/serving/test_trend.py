"""Trend features (trend.py): their values, the families rising together
counted over every family whatever the blocks, and their names."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.predictor.fitting.dataset import build_rows
from speckv.services.predictor.fitting.family_counts import aggregate
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.features import OnlineFeatures, batch_features
from speckv.services.predictor.serving.level_free import _groups
from speckv.services.predictor.serving.trend import trend_names


def _column(spec: FeatureSpec, X: np.ndarray, name: str) -> np.ndarray:
    return X[..., spec.column(name)]


@pytest.mark.parametrize("w", [1, 2, 3])
def test_rise_and_accel_are_the_first_and_second_differences_of_block_sums(w):
    series = np.array([0, 1, 3, 6, 10, 15, 21, 28, 36, 45, 55, 66], dtype=np.float64)
    counts = np.stack([series, np.zeros_like(series)])
    spec = FeatureSpec(trend_spans=(w,))
    X = batch_features(counts, counts.sum(axis=0), spec)
    T = len(series)
    block = [np.array([series[max(t - (j + 1) * w + 1, 0):max(t - j * w + 1, 0)].sum() for t in range(T)])
             for j in range(3)]  # S_1, S_2, S_3 of the module docstring
    np.testing.assert_allclose(_column(spec, X, f"rise_{w}")[0], (block[0] - block[1]) / w)
    np.testing.assert_allclose(_column(spec, X, f"accel_{w}")[0], (block[0] - 2 * block[1] + block[2]) / w)
    np.testing.assert_array_equal(_column(spec, X, f"cluster_rise_{w}")[1], _column(spec, X, f"rise_{w}")[0])
    assert (_column(spec, X, f"rise_{w}")[1] == 0).all()  # the silent family does not move


def test_rising_counts_the_families_whose_last_block_beats_the_one_before():
    counts = np.zeros((4, 12))  # at least the longest lag
    counts[0, 4] = 2  # rising at steps 4 and 5 (w=2): S_1 = 2 > S_2 = 0
    counts[1, 1] = counts[1, 4] = 1  # rising at 1, 2 and 5; at step 4 S_1 = 1 (steps 3..4) = S_2 (steps 1..2)
    counts[2, 5] = 1  # rising at steps 5 and 6
    spec = FeatureSpec(trend_spans=(2,))
    X = batch_features(counts, counts.sum(axis=0), spec)
    assert _column(spec, X, "rising_2")[0].tolist() == [0, 1, 1, 0, 1, 3, 1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("block", [1, 2, 3])
def test_families_rising_together_are_counted_over_every_family_whatever_the_blocks(block):
    rng = np.random.default_rng(4)
    times = np.sort(rng.uniform(0, 300, 600))
    names = [f"f{i}" for i in rng.integers(0, 7, len(times))]
    data = aggregate(times, names, 1.0, 0.0, 300.0)
    spec = FeatureSpec(trend_spans=(2, 5))
    whole = build_rows(data, spec, (1.0, 5.0), 60.0)
    split = build_rows(data, spec, (1.0, 5.0), 60.0, block=block)
    np.testing.assert_array_equal(split.X, whole.X)
    assert whole.X[:, spec.column("rising_5")].max() >= 3  # families do rise together here
    online = OnlineFeatures(spec, capacity=len(data.families))
    dense = data.dense(0, len(data.families))
    last = whole.take(np.flatnonzero(whole.step == whole.step.max()))  # rows end where the horizon does
    for t in range(int(whole.step.max()) + 1):
        online.advance(t, dense[:, t], float(dense[:, t].sum()))
    np.testing.assert_array_equal(online.features(last.family)[:, spec.column("rising_5")],
                                  last.X[:, spec.column("rising_5")])


def test_without_trend_spans_the_names_are_those_saved_models_carry():
    plain = FeatureSpec()
    assert not any(n.startswith(("rise_", "accel_", "rising_", "cluster_rise_")) for n in plain.names())
    spec = FeatureSpec(trend_spans=(2, 5))
    assert spec.names()[:len(plain.names()) - 2] == plain.names()[:-2]  # appended before the time of day
    assert [n for n in spec.names() if n not in plain.names()] == trend_names((2, 5))
    assert FeatureSpec.from_dict(spec.to_dict()) == spec
    assert spec.ring >= 15  # three blocks of the longest span


@pytest.mark.parametrize("spans", [(0,), (2, 2), (-1,), (1.5,)])
def test_bad_trend_spans_are_refused(spans):
    with pytest.raises(ValueError, match="trend_spans"):
        FeatureSpec.from_dict({"trend_spans": list(spans)})


def test_the_level_free_booster_reads_family_trends_relative_to_the_level():
    spec = FeatureSpec(trend_spans=(2,))
    counted, _, cluster, _ = _groups(spec)
    assert spec.column("rise_2") in counted and spec.column("accel_2") in counted
    assert spec.column("cluster_rise_2") in cluster
    assert spec.column("rising_2") not in counted and spec.column("rising_2") not in cluster

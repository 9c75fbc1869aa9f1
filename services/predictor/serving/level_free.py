"""The level-free absolute-error booster ("lightgbm-l1"): one per horizon,
a candidate point forecast for the selection (selection.py).

Why: the count booster (lgbm_bundle.py) models the mean, and its
quantile and burst probability need that; but the served point forecast is
judged by absolute error, which the conditional median minimises, and on
bursty on/off traffic the mean sits far from it. Why level-free: a level
shift between training and serving (a busy hour, then a quiet one) must not
leave the forecast at a level training saw.

Model. With base the level offset's causal level per step (LevelOffset,
the ewma_hl<h>s feature shrunk toward the training mean), for k steps:
    forecast = k * base * g(z),
g the booster's output, trained with objective l1 (config `point.params`)
on target y / (k * base) with weight k * base, so its loss is
sum |y - k * base * g| exactly: the absolute error of the counts. z are
the level-free features (`level_free_features`): every count-valued
feature divided by base (lags, window means, maxima and deviations, EWMAs),
the long-run level as a multiple of base, the cluster terms divided by the
slowest cluster EWMA, and the rest (ratios, times since, turns, time of
day) as they are; plus, per horizon, the seasonal forecast over k * base
when the seasonal candidate exists; and last, log(k * base), the one
absolute term.
Why the absolute term, and thinned copies: Poisson noise is not scale-free
(its relative size falls as the level rises), so how much to trust the
latest steps depends on the level. Trained at one level, a model cannot
know that; so training adds binomially thinned copies of its counts (each
arrival kept with probability p, for each p in `thinning`): the same
traffic's timing at lower levels, where log(k * base) tells the levels
apart. A level drop after training (Azure code: 15.6 arrivals per 5 s in
training, 6.25 after) then lands on levels the model has seen; a rise past
the training level does not, and reads as the highest level seen (the
selection's cap on the model's weight bounds that, selection.py).
Training (fitting/level_free_training.py): the count booster's rows and
weights plus the thinned copies' rows, early stopping on the real
validation slice only, by the same l1 loss.
"""
from __future__ import annotations

import functools

import numpy as np

from speckv.services.predictor.serving.feature_baselines import SEASONAL_NAIVE, FeatureBaselines
from speckv.services.predictor.serving.feature_spec import FeatureSpec

NAME = "lightgbm-l1"
BASE_FLOOR = 1e-6  # counts per step; base is already > 0 whenever the training rows held an arrival
COUNT_PREFIXES = ("lag_", "mean_", "max_", "std_", "ewma_", "rise_", "accel_")  # trend.py's own too


def level_free_features(X: np.ndarray, spec: FeatureSpec, base: np.ndarray,
                        baselines: FeatureBaselines, k: int) -> np.ndarray:
    """z for rows X (float32 (N, features) of spec), base (N,) counts per
    step: float32 (N, extra_columns + features) in spec.names() order, then
    the seasonal column when baselines has a period, then log(k * base)."""
    return LevelFreeRows(X, spec, base, baselines).at(k).copy()


class LevelFreeRows:
    """level_free_features(X, spec, base, baselines, k) for every k of one
    X: the columns that do not depend on k are computed once (a forecast
    asks for every horizon). Each value is computed in float64 by the same
    operations and rounded to float32 once, so at(k) equals
    level_free_features(..., k) bit for bit."""

    def __init__(self, X: np.ndarray, spec: FeatureSpec, base: np.ndarray, baselines: FeatureBaselines) -> None:
        counted, level, cluster, slow = _groups(spec)
        b = np.maximum(np.asarray(base, dtype=np.float64), BASE_FLOOR)
        Z = X.astype(np.float64, copy=True)
        Z[:, counted] /= b[:, None]
        Z[:, level] *= spec.step_s / b
        if len(cluster) and slow >= 0:
            Z[:, cluster] /= np.maximum(X[:, slow].astype(np.float64), BASE_FLOOR)[:, None]
        self._out = np.empty((len(X), X.shape[1] + extra_columns(baselines)), dtype=np.float32)
        self._out[:, :X.shape[1]] = Z
        self._X, self._b, self._baselines = X, b, baselines

    def at(self, k: int) -> np.ndarray:
        """z at k steps, float32 (N, extra_columns + features), C order; the
        same buffer for every k (valid until the next call)."""
        out, b, col = self._out, self._b, self._X.shape[1]
        if SEASONAL_NAIVE in self._baselines.names():
            out[:, col] = self._baselines.forecast(SEASONAL_NAIVE, self._X, k) / (k * b)
            col += 1
        out[:, col] = np.log(k * b)
        return out


def extra_columns(baselines: FeatureBaselines) -> int:
    """Columns level_free_features adds after the spec's features."""
    return 2 if SEASONAL_NAIVE in baselines.names() else 1


@functools.lru_cache(maxsize=64)
def _groups(spec: FeatureSpec) -> tuple[np.ndarray, int, np.ndarray, int]:
    """(count-valued columns, the level column, cluster columns, the slowest
    cluster EWMA's column or -1), derived once per spec."""
    names = spec.names()
    counted = np.array([i for i, n in enumerate(names) if n.startswith(COUNT_PREFIXES)], dtype=np.int64)
    cluster = np.array([i for i, n in enumerate(names) if n.startswith("cluster_")], dtype=np.int64)
    slow = spec.column(f"cluster_ewma_hl{max(spec.cluster_halflives_s):g}s") if spec.cluster_halflives_s else -1
    return counted, spec.column(f"level_hl{spec.long_halflife_s:g}s"), cluster, slow


def level_free_forecast(g: np.ndarray, base: np.ndarray, k: int) -> np.ndarray:
    """k * base * g, float64 (N,), floored at 0 (a count); g: the booster's
    output on the rows' level-free features (its raw score: objective l1
    has no output transform)."""
    return np.maximum(k * np.maximum(np.asarray(base, dtype=np.float64), BASE_FLOOR) * g, 0.0)

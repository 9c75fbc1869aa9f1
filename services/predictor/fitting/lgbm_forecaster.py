"""Training of the LightGBM forecaster (the model it trains, LgbmBundle, and
how it serves: serving/lgbm_bundle.py): one count booster per horizon on
the level offset, the dispersion fitted by moments and the alarm threshold
chosen on the validation slice.

Training is seeded (seed, deterministic=true, num_threads) and reproducible.
Rows whose every future count is zero are sampled at keep_zero with weight
1 / keep_zero: the sums every objective minimises keep their expectation,
and the long idle tails of thousands of families stop dominating the time.
Early stopping watches the validation slice (the newest part of training).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.fitting.dataset import Rows
from speckv.services.predictor.fitting.early_stopped import train_early_stopped
from speckv.services.predictor.judging.evaluation import best_alarm_threshold
from speckv.services.predictor.serving import negbin
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.lgbm_bundle import LevelOffset, LgbmBundle

BASE_PARAMS = {"verbosity": -1, "deterministic": True, "force_row_wise": True}
# Training threads (config "num_threads", default 1): the retrainer shares the
# cores with the serving path, and OpenMP's barriers collapse when a thread is
# descheduled, so a second training thread can make training many times
# slower under load (docs/performance.md, "LightGBM threads").
TRAIN_THREADS = 1


def sample_weights(rows: Rows, keep_zero: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the rows kept for training and their weights."""
    idle = ~(rows.count > 0).any(axis=1)
    if keep_zero >= 1.0:
        return np.arange(len(rows)), np.ones(len(rows))
    rng = np.random.default_rng(seed)
    keep = ~idle | (rng.random(len(rows)) < keep_zero)
    index = np.flatnonzero(keep)
    return index, np.where(idle[index], 1.0 / keep_zero, 1.0)


def fit_offset(train: Rows, weight: np.ndarray, index: np.ndarray, spec: FeatureSpec,
               params: Mapping[str, Any], kmax: int) -> LevelOffset:
    """mu from the (weighted) training rows' count over the longest horizon."""
    counts = train.count[index, -1].astype(np.float64)
    mu = float(np.sum(weight * counts) / max(np.sum(weight), 1e-12)) / kmax if len(index) else 0.0
    offset = LevelOffset(float(params.get("offset_halflife_s", 10.0)), max(mu, 1e-6),
                         float(params.get("prior_steps", 1.0)))
    offset.column(spec)  # names the parameter when the feature is missing
    return offset


def train_bundle(train: Rows, valid: Rows, spec: FeatureSpec, horizons_s: Sequence[float], quantile: float,
                 params: Mapping[str, Any], step_s: float) -> LgbmBundle:
    """Trains one count booster per horizon. params: seed, num_boost_round,
    early_stopping_rounds, keep_zero, offset_halflife_s, prior_steps, and
    "count": the LightGBM parameters."""
    seed = int(params.get("seed", 0))
    base_params = {**BASE_PARAMS, "num_threads": int(params.get("num_threads", TRAIN_THREADS))}
    index, weight = sample_weights(train, float(params.get("keep_zero", 1.0)), seed)
    names = list(spec.names())
    ks = [round(h / step_s) for h in horizons_s]
    offset = fit_offset(train, weight, index, spec, params, max(ks))
    X = np.ascontiguousarray(train.X[index])
    data = lgb.Dataset(X, weight=weight, feature_name=names, free_raw_data=False,
                       params={**base_params, "max_bin": int(params.get("max_bin", 63)), "feature_pre_filter": False})
    data.construct()
    validation = lgb.Dataset(valid.X, reference=data, free_raw_data=False) if len(valid) else None
    stop = int(params.get("early_stopping_rounds", 0))
    count_params = {**base_params, **dict(params.get("count", {})), "seed": seed}
    boosters: list[lgb.Booster] = []
    for i, k in enumerate(ks):
        data.set_label(train.count[index, i].astype(np.float64))
        data.set_init_score(offset.log_base(X, spec, k))
        if validation is not None and stop > 0:
            validation.set_label(valid.count[:, i].astype(np.float64))
            validation.set_init_score(offset.log_base(valid.X, spec, k))
        boosters.append(train_early_stopped(count_params, data, int(params.get("num_boost_round", 100)),
                                            validation, stop))
    bundle = LgbmBundle(spec, tuple(float(h) for h in horizons_s), float(quantile), {"count": boosters},
                        [0.5] * len(ks), offset, [0.0] * len(ks))
    if len(valid):
        expected = bundle.mean(valid.X)
        bundle.dispersion = [negbin.fit_dispersion(expected[:, i], valid.count[:, i]) for i in range(len(ks))]
        _, _, prob = bundle.predict(valid.X)
        bundle.alarm_threshold = [best_alarm_threshold(prob[:, i], valid.label[:, i], valid.onset[:, i],
                                                       valid.family, valid.step, step_s)
                                  for i in range(len(ks))]
    return bundle


def is_sane(bundle: LgbmBundle, X: np.ndarray) -> bool:
    """Every output finite and in range on X."""
    expected, upper, prob = bundle.predict(X)
    return bool(np.isfinite(expected).all() and np.isfinite(upper).all() and np.isfinite(prob).all()
                and not math.isnan(float(expected.sum())))

"""Training of the level-free absolute-error boosters ("lightgbm-l1"; the
model, its features and why: serving/level_free.py). Training rows and
weights are the count booster's (idle rows sampled at keep_zero, weight
1 / keep_zero) plus the thinned copies' training rows; early stopping
watches the real validation slice only, by the same l1 loss.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.fitting.dataset import Rows
from speckv.services.predictor.fitting.early_stopped import train_early_stopped
from speckv.services.predictor.serving.feature_baselines import FeatureBaselines
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.level_free import BASE_FLOOR, level_free_features


def train_level_free(train: Rows, valid: Rows, index: np.ndarray, weight: np.ndarray, base_train: np.ndarray,
                     base_valid: np.ndarray, spec: FeatureSpec, baselines: FeatureBaselines, ks: Sequence[int],
                     point: Mapping[str, Any], base_params: Mapping[str, Any], seed: int) -> list[lgb.Booster]:
    """One l1 booster per horizon. index, weight: the training rows kept
    and their sampling weights; base_*: each row's base (counts per step).
    point: num_boost_round, early_stopping_rounds and the LightGBM params."""
    params = {**base_params, **dict(point.get("params", {})), "seed": seed}
    rounds, stop = int(point.get("num_boost_round", 100)), int(point.get("early_stopping_rounds", 0))
    boosters: list[lgb.Booster] = []
    for i, k in enumerate(ks):
        scale = k * np.maximum(base_train[index], BASE_FLOOR)
        Z = level_free_features(train.X[index], spec, base_train[index], baselines, k)
        data = lgb.Dataset(Z, label=train.count[index, i] / scale, weight=weight * scale, free_raw_data=False,
                           params={"max_bin": int(base_params.get("max_bin", 63)), "feature_pre_filter": False,
                                   "verbosity": -1})
        validation = None
        if len(valid) and stop > 0:
            vscale = k * np.maximum(base_valid, BASE_FLOOR)
            vz = level_free_features(valid.X, spec, base_valid, baselines, k)
            validation = lgb.Dataset(vz, label=valid.count[:, i] / vscale, weight=vscale, reference=data,
                                     free_raw_data=False)
        boosters.append(train_early_stopped(params, data, rounds, validation, stop))
    return boosters

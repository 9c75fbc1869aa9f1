"""LightGBM forecasters (Booster API): per horizon a count model, an upper
quantile model and a burst classifier, all on the features of features.py.

- count: objective from the config (poisson or tweedie) on the count over the
  horizon; its prediction is the expected count;
- upper: objective "quantile" with alpha = quantile;
- burst: objective "binary" on the label of targets.py (BURST_DEFINITION);
  its probability is burst_probability, and alarm_threshold (the probability
  that maximises event F1 on the validation slice, never on the reported
  rows) is stored so consumers can act on it.
Training is seeded (seed, deterministic=true, 2 threads) and reproducible.
Rows whose every future count is zero are sampled at keep_zero with weight
1 / keep_zero: the sums every objective minimises keep their expectation,
and the long idle tails of thousands of families stop dominating the time.
Early stopping watches the validation slice (the newest part of training).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.dataset import Rows
from speckv.services.predictor.evaluation import best_alarm_threshold
from speckv.services.predictor.features import FeatureSpec

KINDS = ("count", "upper", "burst")
BASE_PARAMS = {"verbosity": -1, "deterministic": True, "force_row_wise": True, "num_threads": 2}


@dataclass(slots=True)
class LgbmBundle:
    spec: FeatureSpec
    horizons_s: tuple[float, ...]
    quantile: float
    boosters: dict[str, list[lgb.Booster]]  # kind -> one per horizon
    alarm_threshold: list[float]
    train_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def predict(self, X: np.ndarray, num_threads: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """expected, upper, burst probability: each (N, horizons) float64."""
        out = []
        for kind in KINDS:
            cols = [b.predict(X, num_threads=num_threads) for b in self.boosters[kind]]
            out.append(np.stack(cols, axis=1) if cols else np.zeros((len(X), 0)))
        expected, upper, prob = out
        return np.maximum(expected, 0.0), np.maximum(upper, 0.0), np.clip(prob, 0.0, 1.0)


def sample_weights(rows: Rows, keep_zero: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the rows kept for training and their weights."""
    idle = ~(rows.count > 0).any(axis=1)
    if keep_zero >= 1.0:
        return np.arange(len(rows)), np.ones(len(rows))
    rng = np.random.default_rng(seed)
    keep = ~idle | (rng.random(len(rows)) < keep_zero)
    index = np.flatnonzero(keep)
    return index, np.where(idle[index], 1.0 / keep_zero, 1.0)


def train_bundle(train: Rows, valid: Rows, spec: FeatureSpec, horizons_s: Sequence[float], quantile: float,
                 params: Mapping[str, Any], step_s: float) -> LgbmBundle:
    """Trains every booster. params: seed, num_boost_round,
    early_stopping_rounds, keep_zero, and per kind ("count", "upper",
    "burst") the LightGBM parameters."""
    seed = int(params.get("seed", 0))
    index, weight = sample_weights(train, float(params.get("keep_zero", 1.0)), seed)
    names = list(spec.names())
    data = lgb.Dataset(train.X[index], weight=weight, feature_name=names, free_raw_data=False,
                       params={**BASE_PARAMS, "max_bin": int(params.get("max_bin", 63)),
                               "feature_pre_filter": False})
    data.construct()
    validation = lgb.Dataset(valid.X, reference=data, free_raw_data=False) if len(valid) else None
    boosters: dict[str, list[lgb.Booster]] = {k: [] for k in KINDS}
    for i, _ in enumerate(horizons_s):
        targets = {"count": train.count[index, i], "upper": train.count[index, i],
                   "burst": train.label[index, i].astype(np.float64)}
        vtargets = {"count": valid.count[:, i], "upper": valid.count[:, i], "burst": valid.label[:, i]}
        for kind in KINDS:
            kind_params = {**BASE_PARAMS, **dict(params.get(kind, {})), "seed": seed}
            if kind == "upper":
                kind_params.update(objective="quantile", alpha=quantile)
            if kind == "burst":
                kind_params.update(objective="binary")
            data.set_label(targets[kind])
            callbacks, valid_sets = [], []
            if validation is not None and int(params.get("early_stopping_rounds", 0)) > 0:
                validation.set_label(vtargets[kind].astype(np.float64))
                valid_sets = [validation]
                callbacks = [lgb.early_stopping(int(params["early_stopping_rounds"]), verbose=False)]
            booster = lgb.train(kind_params, data, num_boost_round=int(params.get("num_boost_round", 100)),
                                valid_sets=valid_sets, callbacks=callbacks)
            if booster.best_iteration > 0:
                booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
            boosters[kind].append(booster)
    bundle = LgbmBundle(spec, tuple(float(h) for h in horizons_s), float(quantile), boosters, [])
    if len(valid):
        _, _, prob = bundle.predict(valid.X)
        bundle.alarm_threshold = [best_alarm_threshold(prob[:, i], valid.label[:, i], valid.onset[:, i],
                                                       valid.family, valid.step, step_s)
                                  for i in range(len(horizons_s))]
    else:
        bundle.alarm_threshold = [0.5] * len(horizons_s)
    return bundle


def is_sane(bundle: LgbmBundle, X: np.ndarray) -> bool:
    """Every output finite and in range on X."""
    expected, upper, prob = bundle.predict(X)
    return bool(np.isfinite(expected).all() and np.isfinite(upper).all() and np.isfinite(prob).all()
                and not math.isnan(float(expected.sum())))

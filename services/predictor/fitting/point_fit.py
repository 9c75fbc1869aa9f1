"""Fitting the served point forecast: the level-free boosters, then the
selection on the validation slice (selection.py).

Reads the training rows (boosters) and the validation rows (early stopping,
candidate scores, the choice); nothing else. The validation slice is the
newest part of the training data (training.split_validation), so a
benchmark that trains on a prefix and reports on what follows never lets a
reported row into the choice.

Config (`point` in services/config/predictor.json, fixed before any reported
row was looked at): candidates (names, in the order scores are listed),
thinning (keep probabilities of the thinned copies the level-free boosters
also train on, level_free.py), num_boost_round, early_stopping_rounds and
params of the level-free boosters, selection {margin, min_rows, blend_steps, max_model_weight (one per
class)}, classes {edges_per_s, names}.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from speckv.services.predictor.fitting.dataset import Rows, concat_rows
from speckv.services.predictor.fitting.level_free_training import train_level_free
from speckv.services.predictor.fitting.lgbm_forecaster import BASE_PARAMS, TRAIN_THREADS, sample_weights
from speckv.services.predictor.serving.feature_baselines import FeatureBaselines
from speckv.services.predictor.serving.lgbm_bundle import LEVEL_FREE, LEVEL_FREE_KIND, MODEL_CANDIDATES, LgbmBundle
from speckv.services.predictor.serving.selection import FamilyClasses, SelectionRules, choose


@dataclass(frozen=True, slots=True)
class PointConfig:
    candidates: tuple[str, ...]
    boosting: Mapping[str, Any]  # num_boost_round, early_stopping_rounds, params
    rules: SelectionRules
    classes: FamilyClasses
    thinning: tuple[float, ...] = ()  # keep probabilities of the thinned training copies, each in (0, 1)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "PointConfig":
        selection, classes = raw.get("selection", {}), raw.get("classes", {})
        config = cls(tuple(raw.get("candidates", ())),
                     {k: raw[k] for k in ("num_boost_round", "early_stopping_rounds", "params") if k in raw},
                     SelectionRules(float(selection.get("margin", 0.02)), int(selection.get("min_rows", 200)),
                                    int(selection.get("blend_steps", 10)),
                                    tuple(float(w) for w in selection.get("max_model_weight", ()))),
                     FamilyClasses(tuple(float(e) for e in classes.get("edges_per_s", ())),
                                   tuple(str(n) for n in classes.get("names", ("all-levels",)))),
                     tuple(float(p) for p in raw.get("thinning", ())))
        if not all(0.0 < p < 1.0 for p in config.thinning):
            raise ValueError(f"point.thinning={list(config.thinning)}: each keep probability must be in (0, 1)")
        config.classes.validate()
        config.rules.validate(len(config.classes.names))
        return config


def fit_point(bundle: LgbmBundle, train: Rows, valid: Rows, baselines: FeatureBaselines, config: PointConfig,
              lightgbm: Mapping[str, Any], thinned: Sequence[Rows] = ()) -> None:
    """Trains the level-free boosters (when a candidate) into bundle.boosters
    and sets bundle.baselines and bundle.selection. lightgbm: the count
    booster's parameters (seed, keep_zero, num_threads, max_bin); thinned:
    the training rows of thinned copies of the counts (level_free.py), for
    the level-free boosters only: the choice reads the real validation rows."""
    baselines.validate()
    bundle.baselines = baselines
    known = set(MODEL_CANDIDATES) | set(baselines.names())
    unknown = [n for n in config.candidates if n not in known]
    if unknown:
        raise ValueError(f"point.candidates: {unknown[0]!r} is not one of {', '.join(sorted(known))}")
    if LEVEL_FREE in config.candidates:
        seed = int(lightgbm.get("seed", 0))
        rows = concat_rows([train, *thinned]) if thinned else train
        index, weight = sample_weights(rows, float(lightgbm.get("keep_zero", 1.0)), seed)
        base_params = {**BASE_PARAMS, "num_threads": int(lightgbm.get("num_threads", TRAIN_THREADS)),
                       "max_bin": int(lightgbm.get("max_bin", 63))}
        bundle.boosters[LEVEL_FREE_KIND] = train_level_free(
            rows, valid, index, weight, bundle.offset.base(rows.X, bundle.spec),
            bundle.offset.base(valid.X, bundle.spec), bundle.spec, baselines, bundle.steps(), config.boosting,
            base_params, seed)
    if not len(valid):  # nothing to choose on: the count booster's mean, as before selections existed
        bundle.selection = None
        return
    names = [n for n in config.candidates if n in bundle.candidate_names()]
    values = candidate_values(bundle, valid.X, names)
    models = [n for n in names if n in MODEL_CANDIDATES]
    base = [n for n in names if n not in MODEL_CANDIDATES]
    bundle.selection = choose(values, valid.count, config.classes.classify(bundle.level_per_s(valid.X)),
                              bundle.horizons_s, base, models, config.classes, config.rules)


def candidate_values(bundle: LgbmBundle, X: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """name -> (N, horizons) point forecasts of every named candidate."""
    out = {name: np.empty((len(X), len(bundle.horizons_s))) for name in names}
    for i in range(len(bundle.horizons_s)):
        for name, value in bundle.candidates_at(X, i, names).items():
            out[name][:, i] = value
    return out

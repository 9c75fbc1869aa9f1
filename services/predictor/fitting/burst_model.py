"""Burst probability from a classifier of the burst label (issue 22, item 2).

The count booster's negative binomial gives P(count > threshold) as a side
effect of a model of the mean: its shape is fixed, so a ramp that the trees
see (trend.py's slopes, the families rising together) moves the burst
probability only as far as it moves the mean. Here one binary booster per
horizon ("burst" boosters, objective binary) learns the burst label of
BURST_DEFINITION itself (targets.py: count over h > max(burst_ratio * level *
h, min_burst_count)) from the same features, and its probability is
sigmoid(raw score), exactly what LightGBM's binary predict returns.

Which probability is served, per horizon, is chosen on the validation slice
of training (the newest part; never a reported row): the classifier when its
event F1 at its own best alarm threshold (evaluation.best_alarm_threshold)
is higher than the count distribution's at its own, else the count
distribution (ties to it: the older source, and no bursts in validation
means no evidence). The choice, both sources' validation scores and the
served alarm threshold are recorded in the manifest ("burst",
"alarm_threshold") and shown by GetModelInfo's burst_choices (one
HorizonBurstChoice per horizon, BurstChoice.per_horizon). Training rows and weights are the count booster's
(idle rows sampled at keep_zero, weight 1 / keep_zero: a row with no
arrivals is never a burst, so the sampling keeps the labels' expectation).

Config: `burst` in services/config/predictor.json: num_boost_round,
early_stopping_rounds (on the validation slice's binary log loss) and the
LightGBM params; empty or absent: no classifier, the count distribution.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.fitting.dataset import Rows
from speckv.services.predictor.fitting.early_stopped import train_early_stopped
from speckv.services.predictor.fitting.lgbm_forecaster import BASE_PARAMS, TRAIN_THREADS, sample_weights
from speckv.services.predictor.judging.evaluation import best_alarm_threshold, burst_score
from speckv.services.predictor.serving.burst_choice import BURST_KIND, CLASSIFIER, DISTRIBUTION, BurstChoice

if TYPE_CHECKING:
    from speckv.services.predictor.serving.lgbm_bundle import LgbmBundle


def train_burst(train: Rows, valid: Rows, index: np.ndarray, weight: np.ndarray, config: Mapping[str, Any],
                base_params: Mapping[str, Any], seed: int) -> list[lgb.Booster]:
    """One binary booster per horizon on the rows index (weights weight) of
    train; early stopping on valid's log loss when it holds both labels."""
    params = {**base_params, **dict(config.get("params", {})), "objective": "binary", "seed": seed}
    rounds, stop = int(config.get("num_boost_round", 100)), int(config.get("early_stopping_rounds", 0))
    X = np.ascontiguousarray(train.X[index])
    boosters: list[lgb.Booster] = []
    for i in range(train.label.shape[1]):
        data = lgb.Dataset(X, label=train.label[index, i].astype(np.float64), weight=weight, free_raw_data=False,
                           params={"max_bin": int(base_params.get("max_bin", 63)), "feature_pre_filter": False,
                                   "verbosity": -1})
        labels = valid.label[:, i] if len(valid) else np.zeros(0, bool)
        validation = (lgb.Dataset(valid.X, label=labels.astype(np.float64), reference=data, free_raw_data=False)
                      if stop > 0 and labels.any() and not labels.all() else None)
        boosters.append(train_early_stopped(params, data, rounds, validation, stop))
    return boosters


def fit_burst(bundle: "LgbmBundle", train: Rows, valid: Rows, config: Mapping[str, Any],
              lightgbm: Mapping[str, Any]) -> None:
    """Trains the classifiers into bundle.boosters[BURST_KIND] and sets
    bundle.burst and bundle.alarm_threshold from the validation slice.
    lightgbm: the count booster's seed, keep_zero, num_threads, max_bin."""
    if not config or not len(valid):
        return
    seed = int(lightgbm.get("seed", 0))
    index, weight = sample_weights(train, float(lightgbm.get("keep_zero", 1.0)), seed)
    base_params = {**BASE_PARAMS, "num_threads": int(lightgbm.get("num_threads", TRAIN_THREADS)),
                   "max_bin": int(lightgbm.get("max_bin", 63))}
    bundle.boosters[BURST_KIND] = train_burst(train, valid, index, weight, config, base_params, seed)
    bundle.burst = None  # the distribution's probability first, then the classifier's, on the same rows
    _, _, distribution = bundle.predict(valid.X)
    bundle.burst = BurstChoice((CLASSIFIER,) * len(bundle.horizons_s), ({},) * len(bundle.horizons_s),
                               (0,) * len(bundle.horizons_s))
    _, _, classifier = bundle.predict(valid.X)
    bundle.burst, bundle.alarm_threshold = choose_sources(
        valid, {DISTRIBUTION: distribution, CLASSIFIER: classifier}, bundle.spec.step_s)


def choose_sources(valid: Rows, probs: Mapping[str, np.ndarray], step_s: float) -> tuple[BurstChoice, list[float]]:
    """Per horizon, the source with the higher validation event F1 at its own
    best alarm threshold (ties: DISTRIBUTION), and that threshold.
    probs: source -> (N, horizons) probabilities on valid's rows."""
    sources, scores, episodes, thresholds = [], [], [], []
    for i in range(valid.label.shape[1]):
        per: dict[str, dict[str, float | None]] = {}
        for name in (DISTRIBUTION, CLASSIFIER):
            if name not in probs:
                continue
            p = probs[name][:, i]
            t = best_alarm_threshold(p, valid.label[:, i], valid.onset[:, i], valid.family, valid.step, step_s)
            s = burst_score(valid.label[:, i], p >= t, valid.onset[:, i], valid.family, valid.step, step_s)
            per[name] = {"f1": _num(s.f1), "precision": _num(s.precision), "recall": _num(s.recall),
                         "lead_s": _num(s.lead_time_s), "threshold": t}
        best = max(per, key=lambda n: (per[n]["f1"] or 0.0, n == DISTRIBUTION))
        sources.append(best)
        scores.append(per)
        thresholds.append(float(per[best]["threshold"] or 0.5))
        episodes.append(int(burst_score(valid.label[:, i], np.zeros(len(valid), bool), valid.onset[:, i],
                                        valid.family, valid.step, step_s).episodes))
    return BurstChoice(tuple(sources), tuple(scores), tuple(episodes)), thresholds


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)

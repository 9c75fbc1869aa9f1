"""Training of the session-return model (serving/returns/model.py): one
LightGBM binary classifier per horizon, P(next turn within t of the end).

Training (train_return_model):
- Censoring: for horizon t a training row is used only when its window
  closed inside the data available to training, end_s + t <= until_s
  (dataset.ReturnRows.known). until_s is the start of the evaluated slice, so
  no arrival of that slice decides a training label. Rows whose window is
  still open are dropped whatever their outcome, which keeps the rate honest.
- Validation: of each horizon's usable rows, those ending in the newest
  validation_fraction of their end-time span are the validation slice (early
  stopping on binary log loss); the rest train. A horizon's slice is its own
  because a long horizon's usable rows stop t seconds before until_s.
- Fixed hyperparameters (the `session_return` section of
  services/config/predictor.json), seeded, deterministic, num_threads
  threads (1 by default: the retrainer shares cores with serving).
- A horizon with no usable rows, or with one class only, gets no booster: it
  predicts its training base rate (0 without rows).

- Tail: past the last horizon a row's survival is S_n R(x), R the
  Kaplan-Meier survival of the training rows still idle at t_n
  (survival.kaplan_meier_tail, censored at until_s the same way; read every
  tail.step_s while tail.min_at_risk rows are at risk). Only conditional
  forecasts of conversations idle for a while reach it.
"""
from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.fitting.returns.dataset import ReturnRows
from speckv.services.predictor.judging.returns.evaluation import auc
from speckv.services.predictor.serving.returns import survival
from speckv.services.predictor.serving.returns.model import HorizonFit, ReturnModel

BASE_PARAMS = {"objective": "binary", "verbosity": -1, "deterministic": True, "force_row_wise": True}


def validation_mask(end_s: np.ndarray, fraction: float) -> np.ndarray:
    """Rows ending in the newest `fraction` of [min end, max end]."""
    if not len(end_s) or fraction <= 0:
        return np.zeros(len(end_s), dtype=bool)
    lo, hi = float(end_s.min()), float(end_s.max())
    return end_s > hi - (hi - lo) * fraction


def horizon_rows(rows: ReturnRows, horizons_s: Sequence[float], until_s: float,
                 validation_fraction: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per horizon, (fit, validation) row indices: the rows whose window
    closed by until_s, the newest validation_fraction of their end-time span
    held out for early stopping. Every other row is censored for that horizon."""
    known = rows.known(horizons_s, until_s)
    out = []
    for i in range(len(horizons_s)):
        usable = np.flatnonzero(known[:, i])
        late = validation_mask(rows.end_s[usable], validation_fraction)
        out.append((usable[~late], usable[late]))
    return out


def train_return_model(rows: ReturnRows, horizons_s: Sequence[float], until_s: float,
                       params: Mapping[str, Any], validation_fraction: float) -> ReturnModel:
    """Trains one booster per horizon on the rows whose window closed by
    until_s. params: seed, num_boost_round, early_stopping_rounds,
    num_threads, max_bin, "binary": the LightGBM parameters, and "tail":
    step_s and min_at_risk of the Kaplan-Meier tail."""
    began, cpu = time.perf_counter(), time.process_time()
    horizons = tuple(float(h) for h in horizons_s)
    labels = rows.labels(horizons)
    seed = int(params.get("seed", 0))
    threads = int(params.get("num_threads", 1))
    booster_params = {**dict(params.get("binary", {})), **BASE_PARAMS, "seed": seed, "num_threads": threads}
    dataset_params = {"max_bin": int(params.get("max_bin", 63)), "feature_pre_filter": False, "verbosity": -1}
    stop = int(params.get("early_stopping_rounds", 0))
    rounds = int(params.get("num_boost_round", 100))
    names = list(rows.names)
    boosters: list[lgb.Booster | None] = []
    fits: list[HorizonFit] = []
    for i, (horizon, (fit_index, valid_index)) in enumerate(
            zip(horizons, horizon_rows(rows, horizons, until_s, validation_fraction))):
        y_fit, y_valid = labels[fit_index, i], labels[valid_index, i]
        usable = len(fit_index) + len(valid_index)
        rate = float((y_fit.sum() + y_valid.sum()) / usable) if usable else math.nan
        if not len(fit_index) or y_fit.all() or not y_fit.any():
            boosters.append(None)
            fits.append(HorizonFit(horizon, len(fit_index), len(valid_index), rate, 0, math.nan))
            continue
        data = lgb.Dataset(rows.X[fit_index], label=y_fit.astype(np.float64), feature_name=names,
                           params=dataset_params, free_raw_data=False)
        valid_sets, callbacks = [], []
        if len(valid_index) and stop > 0:
            valid_sets = [lgb.Dataset(rows.X[valid_index], label=y_valid.astype(np.float64), reference=data,
                                      params=dataset_params)]
            callbacks = [lgb.early_stopping(stop, verbose=False)]
        booster = lgb.train(booster_params, data, num_boost_round=rounds, valid_sets=valid_sets,
                            callbacks=callbacks)
        if booster.best_iteration > 0:
            booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
        boosters.append(booster)
        valid_auc = (auc(booster.predict(rows.X[valid_index], num_threads=threads), y_valid) if len(valid_index)
                     else math.nan)
        fits.append(HorizonFit(horizon, len(fit_index), len(valid_index), rate, booster.num_trees(), valid_auc))
    tail_params = params.get("tail", {})
    tail = survival.kaplan_meier_tail(rows.delay_s, until_s - rows.end_s, horizons[-1],
                                      float(tail_params.get("step_s", 60.0)), int(tail_params.get("min_at_risk", 50)))
    model = ReturnModel(horizons, tuple(rows.names), boosters, fits, tail)
    model.train_s = time.perf_counter() - began
    model.extra["train_cpu_s"] = time.process_time() - cpu
    model.extra["until_s"] = float(until_s)
    return model

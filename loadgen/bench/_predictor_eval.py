"""Scoring for `speckv bench predictor`: every model on the same rows.

A model's outputs per row and horizon are expected count, upper quantile and
burst probability. Baselines (a mean only) take the Poisson quantile and the
Poisson tail above the burst threshold, as the online rate models do. Each
model's alarm threshold is chosen on the validation slice of training, never
on the reported rows.

Returns (the session-return event of sparse families, see BURST_DEFINITION):
a row is a return row for horizon h when its family had no arrival for at
least the longest horizon (since_arrival_s >= max(horizons): a silence, not
a gap between two requests of a busy family) and arrives within h; the alarm is
P(count >= 1) >= a threshold chosen on the validation slice like the burst
alarm. Scored as events like bursts (no lead time: rows do not say when in
the horizon the return lands).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from speckv.services.predictor import negbin, poisson
from speckv.services.predictor.dataset import Rows
from speckv.services.predictor.evaluation import best_alarm_threshold, burst_score, mae, pinball, rmse
from speckv.services.predictor.features import FeatureSpec
from speckv.services.predictor.lgbm_forecaster import LgbmBundle

SINCE_ARRIVAL_COL = FeatureSpec().names().index("since_arrival_s")  # before the optional time-of-day terms


@dataclass(slots=True)
class Outputs:
    expected: np.ndarray  # (N, horizons)
    upper: np.ndarray
    prob: np.ndarray
    p_any: np.ndarray  # P(count >= 1)


def poisson_outputs(mean: np.ndarray, threshold: np.ndarray, q: float) -> Outputs:
    mean = np.maximum(np.asarray(mean, dtype=np.float64), 0.0)
    return Outputs(mean, poisson.quantile(q, mean), poisson.exceed_probability(threshold, mean), -np.expm1(-mean))


def lgbm_outputs(bundle: LgbmBundle, X: np.ndarray) -> Outputs:
    expected, upper, prob = bundle.predict(X)
    p_any = np.stack([negbin.exceed_probability(np.zeros(len(X)), expected[:, i], phi)
                      for i, phi in enumerate(bundle.dispersion)], axis=1)
    return Outputs(expected, upper, prob, p_any)


def median_outputs(bundle: LgbmBundle, out: Outputs) -> Outputs:
    """out with the expected count replaced by the distribution's median."""
    median = np.stack([negbin.quantile(0.5, out.expected[:, i], phi) for i, phi in enumerate(bundle.dispersion)],
                      axis=1)
    return Outputs(median, out.upper, out.prob, out.p_any)


def return_labels(rows: Rows, horizons_s: tuple[float, ...]) -> np.ndarray:
    idle = rows.X[:, SINCE_ARRIVAL_COL] >= max(horizons_s)
    return idle[:, None] & (rows.count >= 1)


def alarm_thresholds(valid: Rows, out: Outputs, step_s: float) -> list[float]:
    return [best_alarm_threshold(out.prob[:, i], valid.label[:, i], valid.onset[:, i], valid.family, valid.step,
                                 step_s) for i in range(out.prob.shape[1])]


def return_thresholds(valid: Rows, out: Outputs, horizons_s: tuple[float, ...], step_s: float) -> list[float]:
    labels = return_labels(valid, horizons_s)
    ones = np.ones(len(valid), dtype=np.int16)
    return [best_alarm_threshold(out.p_any[:, i], labels[:, i], ones, valid.family, valid.step, step_s)
            for i in range(len(horizons_s))]


def score(rows: Rows, out: Outputs, thresholds: list[float], horizons_s: tuple[float, ...], q: float,
          step_s: float, return_thresholds: list[float]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    returns = return_labels(rows, horizons_s)
    ones = np.ones(len(rows), dtype=np.int16)
    for i, h in enumerate(horizons_s):
        ret = burst_score(returns[:, i], out.p_any[:, i] >= return_thresholds[i], ones, rows.family, rows.step,
                          step_s)
        truth = rows.count[:, i].astype(np.float64)
        burst = burst_score(rows.label[:, i], out.prob[:, i] >= thresholds[i], rows.onset[:, i], rows.family,
                            rows.step, step_s)
        result[f"h{h:g}"] = {
            "mae": mae(out.expected[:, i], truth), "rmse": rmse(out.expected[:, i], truth),
            "pinball": pinball(out.upper[:, i], truth, q),
            "burst_precision": _num(burst.precision), "burst_recall": _num(burst.recall),
            "burst_f1": _num(burst.f1), "lead_time_s": _num(burst.lead_time_s),
            "burst_episodes": burst.episodes, "alarm_episodes": burst.alarms, "alarm_threshold": thresholds[i],
            "return_precision": _num(ret.precision), "return_recall": _num(ret.recall), "return_f1": _num(ret.f1),
            "return_episodes": ret.episodes, "return_alarm_threshold": return_thresholds[i],
        }
    return result


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)

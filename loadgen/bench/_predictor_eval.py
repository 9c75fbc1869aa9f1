"""Scoring for `speckv bench predictor`: every model on the same rows.

A model's outputs per row and horizon are expected count, upper quantile and
burst probability. Baselines (a mean only) take the Poisson quantile and the
Poisson tail above the burst threshold, as the online rate models do. Each
model's alarm threshold is chosen on the validation slice of training, never
on the reported rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from speckv.services.predictor import poisson
from speckv.services.predictor.dataset import Rows
from speckv.services.predictor.evaluation import best_alarm_threshold, burst_score, mae, pinball, rmse


@dataclass(slots=True)
class Outputs:
    expected: np.ndarray  # (N, horizons)
    upper: np.ndarray
    prob: np.ndarray


def poisson_outputs(mean: np.ndarray, threshold: np.ndarray, q: float) -> Outputs:
    mean = np.maximum(np.asarray(mean, dtype=np.float64), 0.0)
    return Outputs(mean, poisson.quantile(q, mean), poisson.exceed_probability(threshold, mean))


def alarm_thresholds(valid: Rows, out: Outputs, step_s: float) -> list[float]:
    return [best_alarm_threshold(out.prob[:, i], valid.label[:, i], valid.onset[:, i], valid.family, valid.step,
                                 step_s) for i in range(out.prob.shape[1])]


def score(rows: Rows, out: Outputs, thresholds: list[float], horizons_s: tuple[float, ...], q: float,
          step_s: float) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for i, h in enumerate(horizons_s):
        truth = rows.count[:, i].astype(np.float64)
        burst = burst_score(rows.label[:, i], out.prob[:, i] >= thresholds[i], rows.onset[:, i], rows.family,
                            rows.step, step_s)
        result[f"h{h:g}"] = {
            "mae": mae(out.expected[:, i], truth), "rmse": rmse(out.expected[:, i], truth),
            "pinball": pinball(out.upper[:, i], truth, q),
            "burst_precision": _num(burst.precision), "burst_recall": _num(burst.recall),
            "burst_f1": _num(burst.f1), "lead_time_s": _num(burst.lead_time_s),
            "burst_episodes": burst.episodes, "alarm_episodes": burst.alarms, "alarm_threshold": thresholds[i],
        }
    return result


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)

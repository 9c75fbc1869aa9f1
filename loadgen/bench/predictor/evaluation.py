"""Scoring for `speckv bench predictor`: every model on the same rows.

A model's outputs per row and horizon are expected count, upper quantile and
burst probability. Baselines (a mean only) take the Poisson quantile and the
Poisson tail above the burst threshold, as the online rate models do. Each
model's alarm threshold is chosen on the validation slice of training, never
on the reported rows.

Point forecasts: "served" is what the service serves (the expected count
chosen on validation per horizon and family class, selection.py, with the
count booster's quantile and burst probability); each model candidate is
scored alone beside it with the same distribution. The Poisson floor is a
ceiling measured on the same rows: the expected absolute error of the
median of Poisson(the family's realised rate over a centred window,
FLOOR_WINDOW_S), i.e. what a forecaster that knew each row's local rate
exactly, and nothing more, would score on a Poisson stream. It reads the
future, so it is a reference, never a model.

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
from scipy import stats

from speckv.services.predictor.fitting.dataset import Rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.judging.evaluation import best_alarm_threshold, burst_score, mae, pinball, rmse
from speckv.services.predictor.serving import negbin, poisson
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.lgbm_bundle import LgbmBundle

FLOOR_WINDOW_S = 60.0  # the Poisson floor's centred window: long enough to average, short against level shifts


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
    """The served forecast: the chosen point forecast, the count booster's
    distribution (P(count >= 1) from it too)."""
    expected, upper, prob = bundle.predict(X)
    mean = bundle.mean(X)
    p_any = np.stack([negbin.exceed_probability(np.zeros(len(X)), mean[:, i], phi)
                      for i, phi in enumerate(bundle.dispersion)], axis=1)
    return Outputs(expected, upper, prob, p_any)


def candidate_outputs(bundle: LgbmBundle, X: np.ndarray, served: Outputs, name: str) -> Outputs:
    """served with the point forecast replaced by candidate `name`'s."""
    point = np.stack([bundle.candidates_at(X, i, [name])[name] for i in range(len(bundle.horizons_s))], axis=1)
    return Outputs(point, served.upper, served.prob, served.p_any)


def poisson_floor(rows: Rows, counts: FamilyCounts, horizons_s: tuple[float, ...]) -> np.ndarray:
    """Per horizon, the mean over rows of E|N - median(N)|, N ~ Poisson(k *
    the row family's mean count per step over the FLOOR_WINDOW_S centred on
    the row's step, clipped to the data): (horizons,)."""
    c = counts.counts
    T = counts.steps
    half = max(1, round(FLOOR_WINDOW_S / counts.step_s / 2))
    fam = np.repeat(np.arange(len(counts.families)), np.diff(c.indptr))
    keys = fam.astype(np.int64) * (T + 1) + c.indices
    cum = np.concatenate([[0.0], np.cumsum(c.data)])

    def before(f: np.ndarray, step: np.ndarray) -> np.ndarray:  # arrivals of f in steps < step
        return cum[np.searchsorted(keys, f.astype(np.int64) * (T + 1) + step)]

    lo = np.maximum(rows.step.astype(np.int64) - half, 0)
    hi = np.minimum(rows.step.astype(np.int64) + half + 1, T)
    rate = (before(rows.family, hi) - before(rows.family, lo)) / (hi - lo)
    out = []
    for h in horizons_s:
        lam = rate * round(h / counts.step_s)
        values, inverse = np.unique(lam, return_inverse=True)
        out.append(float(np.mean(_poisson_median_mae(values)[inverse.ravel()])) if len(lam) else math.nan)
    return np.array(out)


def _poisson_median_mae(lam: np.ndarray) -> np.ndarray:
    """E|N - median(N)| for N ~ Poisson(lam), each lam."""
    out = np.zeros(len(lam))
    for j, value in enumerate(lam):
        if value <= 0:
            continue
        top = int(value + 12.0 * math.sqrt(value) + 12)
        k = np.arange(top + 1)
        pmf = stats.poisson.pmf(k, value)
        median = stats.poisson.median(value)
        out[j] = float(np.sum(pmf * np.abs(k - median)))
    return out


def return_labels(rows: Rows, spec: FeatureSpec, horizons_s: tuple[float, ...]) -> np.ndarray:
    """Return rows: the family silent for at least the longest horizon, then an arrival within h."""
    idle = rows.X[:, spec.names().index("since_arrival_s")] >= max(horizons_s)
    return idle[:, None] & (rows.count >= 1)


def alarm_thresholds(valid: Rows, out: Outputs, step_s: float) -> list[float]:
    return [best_alarm_threshold(out.prob[:, i], valid.label[:, i], valid.onset[:, i], valid.family, valid.step,
                                 step_s) for i in range(out.prob.shape[1])]


def return_thresholds(valid: Rows, out: Outputs, spec: FeatureSpec, horizons_s: tuple[float, ...],
                      step_s: float) -> list[float]:
    labels = return_labels(valid, spec, horizons_s)
    ones = np.ones(len(valid), dtype=np.int16)
    return [best_alarm_threshold(out.p_any[:, i], labels[:, i], ones, valid.family, valid.step, step_s)
            for i in range(len(horizons_s))]


def score(rows: Rows, out: Outputs, thresholds: list[float], spec: FeatureSpec, horizons_s: tuple[float, ...],
          q: float, step_s: float, return_thresholds: list[float]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    returns = return_labels(rows, spec, horizons_s)
    ones = np.ones(len(rows), dtype=np.int16)
    for i, h in enumerate(horizons_s):
        ret = burst_score(returns[:, i], out.p_any[:, i] >= return_thresholds[i], ones, rows.family, rows.step,
                          step_s)
        truth = rows.count[:, i].astype(np.float64)
        burst = burst_score(rows.label[:, i], out.prob[:, i] >= thresholds[i], rows.onset[:, i], rows.family,
                            rows.step, step_s)
        result[f"h{h:g}"] = {
            "mae": mae(out.expected[:, i], truth), "median_ae": _median_ae(out.expected[:, i], truth),
            "rmse": rmse(out.expected[:, i], truth),
            "pinball": pinball(out.upper[:, i], truth, q),
            "burst_precision": _num(burst.precision), "burst_recall": _num(burst.recall),
            "burst_f1": _num(burst.f1), "lead_time_s": _num(burst.lead_time_s),
            "lead_mean_s": _num(burst.lead_mean_s), "burst_early": _num(burst.early),
            "burst_episodes": burst.episodes, "alarm_episodes": burst.alarms, "alarm_threshold": thresholds[i],
            "return_precision": _num(ret.precision), "return_recall": _num(ret.recall), "return_f1": _num(ret.f1),
            "return_episodes": ret.episodes, "return_alarm_threshold": return_thresholds[i],
        }
    return result


def _median_ae(pred: np.ndarray, truth: np.ndarray) -> float | None:
    """The median absolute error (None without rows)."""
    return float(np.median(np.abs(pred - truth))) if len(truth) else None


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)

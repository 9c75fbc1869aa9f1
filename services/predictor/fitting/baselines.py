"""Baseline count forecasters for the benchmark harness, over whole series.

Each predicts the count over each horizon of k steps after step s from data
up to step s only:
- last-value: the count of step s, times k;
- ewma: the exposure-corrected EWMA count per step (half-life halflife_s, the
  `ewma_hl<h>s` feature), times k;
- seasonal-naive: step s + j repeats step s + j - P * ceil(j / P), P the
  season in steps. P is fitted on the training part only: the lag in
  [2, max_season_s] with the largest autocorrelation of the cluster total;
- arima: see arima.py.
Their upper quantile and burst probability come from a Poisson count with
that mean (models.py does the same online).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from speckv.services.predictor.serving.feature_spec import FeatureSpec


class LastValue:
    name = "last-value"

    def __init__(self, spec: FeatureSpec) -> None:
        self._col = spec.names().index("lag_1")

    def predict_block(self, counts: np.ndarray, features: np.ndarray, ks: Sequence[int]) -> np.ndarray:
        return features[:, :, self._col, None].astype(np.float64) * np.asarray(ks, dtype=np.float64)


class Ewma:
    name = "ewma"

    def __init__(self, spec: FeatureSpec, halflife_s: float) -> None:
        self._col = spec.names().index(f"ewma_hl{halflife_s:g}s")

    def predict_block(self, counts: np.ndarray, features: np.ndarray, ks: Sequence[int]) -> np.ndarray:
        return features[:, :, self._col, None].astype(np.float64) * np.asarray(ks, dtype=np.float64)


class SeasonalNaive:
    name = "seasonal-naive"

    def __init__(self, period_steps: int) -> None:
        if period_steps < 1:
            raise ValueError(f"period_steps={period_steps}: must be >= 1")
        self.period = int(period_steps)

    @staticmethod
    def fit_period(total: np.ndarray, max_lag: int) -> int:
        """The lag in [2, max_lag] with the largest autocorrelation of total."""
        x = np.asarray(total, dtype=np.float64) - np.mean(total)
        denom = float(x @ x) or 1.0
        lags = np.arange(2, max(3, min(max_lag, len(x) // 2) + 1))
        acf = np.array([float(x[lag:] @ x[:-lag]) / denom for lag in lags])
        return int(lags[int(np.argmax(acf))])

    def predict_block(self, counts: np.ndarray, features: np.ndarray, ks: Sequence[int]) -> np.ndarray:
        n, T = counts.shape
        P = self.period
        out = np.zeros((n, T, len(ks)))
        acc = np.zeros((n, T))
        j_done = 0
        for i, k in enumerate(ks):
            for j in range(j_done + 1, k + 1):
                back = P * -(-j // P) - j  # steps before s of the step repeated at s + j
                shifted = np.zeros((n, T))
                if back < T:
                    shifted[:, back:] = counts[:, :T - back]
                acc += shifted
            j_done = k
            out[:, :, i] = acc
        return out

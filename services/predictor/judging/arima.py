"""ARIMA baseline (the forecaster NVIDIA Dynamo's planner uses), fitted with
statsmodels and run over thousands of families at once.

Fit: SARIMAX(order, trend="c") by maximum likelihood on the training part of
one series: the family itself when there is one, else the mean per-family
series of the training families (a per-family fit is meaningless for families
with a handful of arrivals, and thousands of fits do not fit the budget).
Apply: the fitted model's state-space form (T, c, Z, d) with its steady-state
Kalman gain K (the gain at the end of the fit, where it has converged) runs
over every family's series in one vectorised pass:
    a[t+1] = T a[t] + c + K (y[t] - d - Z a[t])
and the forecast of step t + j made at t is d + Z a[t+j|t], with
a[t+j+1|t] = T a[t+j|t] + c. Counts over a horizon sum these, floored at 0.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np


class Arima:
    name = "arima"

    def __init__(self, order: tuple[int, int, int]) -> None:
        self.order = tuple(int(o) for o in order)
        self._T = self._c = self._Z = self._K = self._a0 = None
        self._d = 0.0

    def fit(self, series: np.ndarray) -> "Arima":
        from statsmodels.tsa.statespace.sarimax import SARIMAX

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = SARIMAX(np.asarray(series, dtype=np.float64), order=self.order, trend="c").fit(disp=False)
        f = result.filter_results
        self._T = np.asarray(f.transition[:, :, 0])
        self._c = np.asarray(f.state_intercept[:, 0])
        self._Z = np.asarray(f.design[0, :, 0])
        self._d = float(f.obs_intercept[0, 0])
        self._K = np.asarray(f.kalman_gain[:, 0, -1])
        self._a0 = np.asarray(f.predicted_state[:, 0])
        return self

    def predict_block(self, counts: np.ndarray, features: np.ndarray, ks: Sequence[int]) -> np.ndarray:
        if self._T is None:
            raise RuntimeError("fit() first")
        n, T = counts.shape
        kmax = max(ks)
        a = np.tile(self._a0, (n, 1))  # predicted state for step t, given data before t
        out = np.zeros((n, T, len(ks)))
        Tt = self._T.T
        for t in range(T):
            a = a @ Tt + self._c + np.outer(counts[:, t] - self._d - a @ self._Z, self._K)
            ahead, acc = a, np.zeros(n)
            for j in range(1, kmax + 1):
                acc = acc + np.maximum(self._d + ahead @ self._Z, 0.0)
                for i, k in enumerate(ks):
                    if k == j:
                        out[:, t, i] = acc
                ahead = ahead @ Tt + self._c
        return out

"""Baselines for return probabilities, fitted on the same censored training
rows as the model (label known by the training cut, dataset.ReturnRows.known),
so the model's value over them is visible.

- ConstantRate: every row gets the training base rate of its horizon.
- BucketRate: the training rate of the row's bucket of one feature column,
  shrunk toward the base rate by prior_rows pseudo-rows,
      rate_b = (positives_b + prior_rows * base) / (rows_b + prior_rows),
  so an empty bucket reads the base rate. Buckets: NaN values form bucket 0;
  a value v falls in bucket 1 + (number of edges <= v). by_turn buckets
  turn_index, by_gap buckets gap_prev_s (turn 0, with no gap, is the NaN
  bucket).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.predictor.fitting.returns.dataset import ReturnRows


def _rates(labels: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Per-horizon rate over the known rows, (H,); 0 where none is known."""
    rows = known.sum(axis=0)
    positives = (labels & known).sum(axis=0)
    return np.where(rows > 0, positives / np.maximum(rows, 1), 0.0)


@dataclass(frozen=True, slots=True)
class ConstantRate:
    name: str
    rates: tuple[float, ...]  # per horizon

    @classmethod
    def fit(cls, rows: ReturnRows, horizons_s: Sequence[float], until_s: float,
            name: str = "constant") -> "ConstantRate":
        rates = _rates(rows.labels(horizons_s), rows.known(horizons_s, until_s))
        return cls(name, tuple(float(r) for r in rates))

    def predict(self, rows: ReturnRows) -> np.ndarray:
        return np.broadcast_to(np.asarray(self.rates), (len(rows), len(self.rates))).copy()


@dataclass(frozen=True, slots=True)
class BucketRate:
    name: str
    column: str
    edges: tuple[float, ...]  # increasing
    rates: tuple[tuple[float, ...], ...]  # [bucket][horizon]

    @staticmethod
    def bucket(values: np.ndarray, edges: Sequence[float]) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        inner = 1 + np.searchsorted(np.asarray(edges, dtype=np.float64), values, side="right")
        return np.where(np.isnan(values), 0, inner)

    @classmethod
    def fit(cls, rows: ReturnRows, horizons_s: Sequence[float], until_s: float, column: str,
            edges: Sequence[float], prior_rows: float, name: str) -> "BucketRate":
        labels, known = rows.labels(horizons_s), rows.known(horizons_s, until_s)
        base = _rates(labels, known)
        buckets = cls.bucket(rows.column(column), edges)
        table = []
        for b in range(len(edges) + 2):
            inside = known & (buckets == b)[:, None]
            n, positives = inside.sum(axis=0), (labels & inside).sum(axis=0)
            table.append(tuple(float(x) for x in (positives + prior_rows * base) / np.maximum(n + prior_rows, 1e-12)))
        return cls(name, column, tuple(float(e) for e in edges), tuple(table))

    def predict(self, rows: ReturnRows) -> np.ndarray:
        table = np.asarray(self.rates)
        return table[self.bucket(rows.column(self.column), self.edges)]


def fit_baselines(rows: ReturnRows, horizons_s: Sequence[float], until_s: float, turn_edges: Sequence[float],
                  gap_edges_s: Sequence[float], prior_rows: float) -> list[ConstantRate | BucketRate]:
    """constant, by_turn and by_gap, fitted on rows censored at until_s."""
    if not math.isfinite(prior_rows) or prior_rows < 0:
        raise ValueError(f"prior_rows={prior_rows}: must be finite and >= 0")
    return [ConstantRate.fit(rows, horizons_s, until_s),
            BucketRate.fit(rows, horizons_s, until_s, "turn_index", turn_edges, prior_rows, "by_turn"),
            BucketRate.fit(rows, horizons_s, until_s, "gap_prev_s", gap_edges_s, prior_rows, "by_gap")]

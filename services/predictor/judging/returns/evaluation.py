"""Scores of return probabilities against 0/1 outcomes.

- AUC: the rank (Mann-Whitney) form, (sum of the positives' ranks -
  P (P + 1) / 2) / (P N), ranks averaged over ties (scipy.stats.rankdata), P
  positives and N negatives; the probability that a random positive scores
  above a random negative, ties counting one half. NaN when a class is empty.
- Brier score: mean (p - y)^2.
- Expected calibration error with 10 equal-mass bins: rows sorted by p; the
  nominal bin of the row at sorted position r (0-based, of n) is
  floor(10 r / n); a run of tied p takes the bin of its first row, so ties
  never straddle bins (bins can be unequal or empty: a constant forecast is one
  bin). ECE = sum over non-empty bins b of (n_b / n) |mean(y in b) - mean(p
  in b)|, in probability units (0.05 = five points off on average).
- calibration_table: per non-empty bin, its row count, p range, mean p and
  observed rate: the reliability diagram in numbers.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.stats import rankdata

ECE_BINS = 10


def auc(p: np.ndarray, y: np.ndarray) -> float:
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if not positives or not negatives:
        return math.nan
    ranks = rankdata(p)
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def brier(p: np.ndarray, y: np.ndarray) -> float:
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(np.mean((p - y) ** 2)) if len(p) else math.nan


def calibration_bins(p: np.ndarray, bins: int = ECE_BINS) -> np.ndarray:
    """Bin index of each row (equal mass, ties kept together), int (n,)."""
    p = np.asarray(p, dtype=np.float64)
    n = len(p)
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(p, kind="stable")
    nominal = (np.arange(n) * bins) // n
    _, first, inverse = np.unique(p[order], return_index=True, return_inverse=True)
    out = np.empty(n, dtype=np.int64)
    out[order] = nominal[first][inverse.ravel()]
    return out


def calibration_table(p: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> list[dict[str, float]]:
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    index = calibration_bins(p, bins)
    table = []
    for b in np.unique(index):
        mask = index == b
        table.append({"bin": int(b), "rows": int(mask.sum()), "p_min": float(p[mask].min()),
                      "p_max": float(p[mask].max()), "mean_p": float(p[mask].mean()),
                      "observed": float(y[mask].mean())})
    return table


def ece(p: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> float:
    table = calibration_table(p, y, bins)
    n = sum(row["rows"] for row in table)
    if not n:
        return math.nan
    return float(sum(row["rows"] / n * abs(row["observed"] - row["mean_p"]) for row in table))


def score(p: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """rows, base rate, mean p, AUC, Brier, ECE of one forecast."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=bool)
    return {"rows": int(len(y)), "base_rate": float(y.mean()) if len(y) else math.nan,
            "mean_p": float(p.mean()) if len(p) else math.nan, "auc": auc(p, y), "brier": brier(p, y),
            "ece": ece(p, y)}

"""What a forecast is judged against: future counts and burst labels.

For a row (family f, step s) and horizon h (a whole number k of steps):
- count = arrivals of f in steps s + 1 .. s + k, i.e. in (now, now + h] with
  now the end of step s; NaN where the series ends before s + k;
- threshold = max(burst_ratio * level * h, min_burst_count), level being the
  family's long-run rate at s (the `level_hl<L>s` feature); label = count >
  threshold. This is BURST_DEFINITION (models.py), with the discrete,
  exposure-corrected EWMA of features.py as the trailing level;
- onset: the burst's first second, as steps after s: the first step in
  s + 1 .. s + k whose own count exceeds threshold / k (the burst running
  above the threshold's rate), else 1 (an evenly spread burst starts at once).
"""
from __future__ import annotations

import numpy as np


def horizon_steps(horizons_s: tuple[float, ...] | list[float], step_s: float) -> list[int]:
    out = [round(h / step_s) for h in horizons_s]
    for h, k in zip(horizons_s, out):
        if k < 1 or abs(k * step_s - h) > 1e-9 * max(h, 1.0):
            raise ValueError(f"horizon {h:g} s is not a whole number of {step_s:g} s steps")
    return out


def future_counts(counts: np.ndarray, k: int) -> np.ndarray:
    """(rows, steps) arrivals in the k steps after each step; NaN at the end."""
    n, T = counts.shape
    cs = np.concatenate([np.zeros((n, 1)), np.cumsum(counts, axis=1)], axis=1)
    out = np.full((n, T), np.nan)
    if T > k:
        out[:, :T - k] = cs[:, k + 1:] - cs[:, 1:T - k + 1]
    return out


def burst_threshold(level: np.ndarray, horizon_s: float, burst_ratio: float, min_burst_count: float) -> np.ndarray:
    return np.maximum(burst_ratio * np.asarray(level, dtype=np.float64) * horizon_s, min_burst_count)


def onset_steps(counts: np.ndarray, threshold: np.ndarray, k: int) -> np.ndarray:
    """(rows, steps) int16: steps from s to the burst's first second (1..k)."""
    n, T = counts.shape
    onset = np.zeros((n, T), dtype=np.int16)
    for j in range(k, 0, -1):  # smallest j that qualifies wins
        ahead = np.zeros((n, T))
        ahead[:, :T - j] = counts[:, j:]
        onset = np.where(ahead > threshold / k, j, onset).astype(np.int16)
    return np.where(onset == 0, 1, onset).astype(np.int16)
